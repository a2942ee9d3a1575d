//go:build verbs

package verbs

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// rm_wr and rm_wc are the plain (pointer-free) forms of a send work
// request and a work completion that Go fills and reads: one cgo call posts
// or polls a whole batch.
struct rm_wr {
	uint64_t wr_id, laddr, raddr, cmp, swp;
	uint32_t len, lkey, rkey, op, signaled;
};

struct rm_wc {
	uint64_t wr_id;
	uint32_t status, opcode, byte_len, vendor_err;
};

static int rm_device_list(struct ibv_device ***out) {
	int n = 0;
	errno = 0;
	*out = ibv_get_device_list(&n);
	if (*out == NULL)
		return errno ? -errno : -ENODEV;
	return n;
}

static const char *rm_device_name(struct ibv_device **l, int i) { return ibv_get_device_name(l[i]); }
static struct ibv_context *rm_open(struct ibv_device **l, int i) { return ibv_open_device(l[i]); }

static int rm_query_port(struct ibv_context *c, uint8_t port, uint16_t *lid, uint32_t *mtu,
		int *gids, int *state, int *ethernet) {
	struct ibv_port_attr a;
	memset(&a, 0, sizeof a);
	int rc = ibv_query_port(c, port, &a);
	if (rc)
		return rc;
	*lid = a.lid;
	*mtu = a.active_mtu;
	*gids = a.gid_tbl_len;
	*state = a.state;
	*ethernet = a.link_layer == IBV_LINK_LAYER_ETHERNET;
	return 0;
}

static int rm_query_device(struct ibv_context *c, int *ports, int *max_qp_wr, int *max_rd_atom,
		int *max_cqe, int *atomic_cap) {
	struct ibv_device_attr a;
	int rc = ibv_query_device(c, &a);
	if (rc)
		return rc;
	*ports = a.phys_port_cnt;
	*max_qp_wr = a.max_qp_wr;
	*max_rd_atom = a.max_qp_rd_atom < a.max_qp_init_rd_atom ? a.max_qp_rd_atom : a.max_qp_init_rd_atom;
	*max_cqe = a.max_cqe;
	*atomic_cap = a.atomic_cap;
	return 0;
}

static int rm_query_gid(struct ibv_context *c, uint8_t port, int idx, uint8_t *gid) {
	union ibv_gid g;
	int rc = ibv_query_gid(c, port, idx, &g);
	if (rc)
		return rc;
	memcpy(gid, g.raw, 16);
	return 0;
}

static struct ibv_cq *rm_create_cq(struct ibv_context *c, int n, struct ibv_comp_channel *ch) {
	return ibv_create_cq(c, n, NULL, ch, 0);
}

static int rm_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return errno;
	return 0;
}

static struct ibv_qp *rm_create_qp(struct ibv_pd *pd, struct ibv_cq *cq, int depth) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 0;
	a.cap.max_send_wr = depth;
	a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &a);
}

static uint32_t rm_qpn(struct ibv_qp *qp) { return qp->qp_num; }

static int rm_qp_init(struct ibv_qp *qp, uint8_t port, int remote) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = remote ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC : 0;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int rm_qp_rtr(struct ibv_qp *qp, uint8_t port, int global, int sgid, uint32_t mtu,
		uint32_t dqpn, uint32_t rpsn, uint16_t dlid, uint8_t *dgid, int rd_atom) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = rpsn;
	a.max_dest_rd_atomic = rd_atom;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = dlid;
	a.ah_attr.sl = 0;
	a.ah_attr.src_path_bits = 0;
	a.ah_attr.port_num = port;
	if (global) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
		a.ah_attr.grh.sgid_index = sgid;
		a.ah_attr.grh.hop_limit = 64;
	}
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int rm_qp_rts(struct ibv_qp *qp, uint32_t psn, int rd_atom) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;   // 4.096 us * 2^14 = 67 ms per try
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = rd_atom;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int rm_qp_error(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

// rm_post links n requests into the preallocated swr/sge arrays and posts
// them. It returns 0, or the errno and in *bad the index of the first
// request not posted.
static int rm_post(struct ibv_qp *qp, struct rm_wr *w, int n, struct ibv_send_wr *swr,
		struct ibv_sge *sge, int *bad) {
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *s = &swr[i];
		memset(s, 0, sizeof *s);
		s->wr_id = w[i].wr_id;
		sge[i].addr = w[i].laddr;
		sge[i].length = w[i].len;
		sge[i].lkey = w[i].lkey;
		s->sg_list = &sge[i];
		s->num_sge = w[i].len ? 1 : 0;
		s->send_flags = w[i].signaled ? IBV_SEND_SIGNALED : 0;
		switch (w[i].op) {
		case 1:
			s->opcode = IBV_WR_RDMA_READ;
			s->wr.rdma.remote_addr = w[i].raddr;
			s->wr.rdma.rkey = w[i].rkey;
			break;
		case 2:
			s->opcode = IBV_WR_RDMA_WRITE;
			s->wr.rdma.remote_addr = w[i].raddr;
			s->wr.rdma.rkey = w[i].rkey;
			break;
		case 3:
			s->opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
			s->wr.atomic.remote_addr = w[i].raddr;
			s->wr.atomic.rkey = w[i].rkey;
			s->wr.atomic.compare_add = w[i].cmp;
			s->wr.atomic.swap = w[i].swp;
			break;
		case 4:
			s->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
			s->wr.atomic.remote_addr = w[i].raddr;
			s->wr.atomic.rkey = w[i].rkey;
			s->wr.atomic.compare_add = w[i].cmp;
			break;
		default:
			*bad = i;
			return EINVAL;
		}
		s->next = i + 1 < n ? &swr[i + 1] : NULL;
	}
	struct ibv_send_wr *b = NULL;
	int rc = ibv_post_send(qp, swr, &b);
	if (rc)
		*bad = b ? (int)(b - swr) : 0;
	return rc;
}

// rm_poll polls up to n (<= 64) completions into out.
static int rm_poll(struct ibv_cq *cq, struct rm_wc *out, int n) {
	struct ibv_wc wc[64];
	if (n > 64)
		n = 64;
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].vendor_err = wc[i].vendor_err;
	}
	return got;
}

static int rm_arm(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// rm_get_event consumes one event of a non-blocking channel: 1 if there was
// one, 0 if none, -errno on error.
static int rm_get_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx)) {
		if (errno == EAGAIN)
			return 0;
		return -errno;
	}
	ibv_ack_cq_events(cq, 1);
	return 1;
}

static struct ibv_mr *rm_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int acc) {
	return ibv_reg_mr(pd, (void *)addr, len, acc);
}

static uint32_t rm_mr_lkey(struct ibv_mr *mr) { return mr->lkey; }
static uint32_t rm_mr_rkey(struct ibv_mr *mr) { return mr->rkey; }
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"rmem/rdma"
)

// Work completion statuses (enum ibv_wc_status) the provider tells apart.
const (
	wcSuccess      = C.IBV_WC_SUCCESS
	wcRemAccessErr = C.IBV_WC_REM_ACCESS_ERR
	wcFlushErr     = C.IBV_WC_WR_FLUSH_ERR
	wcRemInvReqErr = C.IBV_WC_REM_INV_REQ_ERR
)

func wcStatusString(s uint32) string { return C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(s))) }

type cWR = C.struct_rm_wr
type cWC = C.struct_rm_wc

func errnoErr(what string, rc C.int) error {
	if rc < 0 {
		rc = -rc
	}
	return fmt.Errorf("rdma: verbs: %s: %w", what, syscall.Errno(rc))
}

// listDevices opens each device to list its ports and GIDs.
func listDevices() ([]devInfo, error) {
	var list **C.struct_ibv_device
	n := C.rm_device_list(&list)
	if n < 0 {
		return nil, fmt.Errorf("%w (ibv_get_device_list: %w)", ErrNoDevice, syscall.Errno(-n))
	}
	defer C.ibv_free_device_list(list)
	if n == 0 {
		return nil, fmt.Errorf("%w (ibv_get_device_list: no devices; for Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)", ErrNoDevice)
	}
	var out []devInfo
	for i := range int(n) {
		name := C.GoString(C.rm_device_name(list, C.int(i)))
		ctx := C.rm_open(list, C.int(i))
		if ctx == nil {
			continue
		}
		var ports, maxWr, maxAtom, maxCQE, atomicCap C.int
		if C.rm_query_device(ctx, &ports, &maxWr, &maxAtom, &maxCQE, &atomicCap) == 0 {
			for p := 1; p <= int(ports); p++ {
				var lid C.uint16_t
				var mtu C.uint32_t
				var ngid, state, eth C.int
				if C.rm_query_port(ctx, C.uint8_t(p), &lid, &mtu, &ngid, &state, &eth) != 0 {
					continue
				}
				d := devInfo{Name: name, Port: uint8(p), Ethernet: eth != 0, State: int(state)}
				for g := range int(ngid) {
					var gid [16]byte
					if C.rm_query_gid(ctx, C.uint8_t(p), C.int(g), (*C.uint8_t)(unsafe.Pointer(&gid[0]))) != 0 {
						gid = [16]byte{}
					}
					d.GIDs = append(d.GIDs, gid)
				}
				out = append(out, d)
			}
		}
		C.ibv_close_device(ctx)
	}
	return out, nil
}

// device is an open device context on one port with the GID to use.
type device struct {
	ctx      *C.struct_ibv_context
	name     string
	port     uint8
	gidIndex int
	gid      [16]byte
	lid      uint16
	mtu      uint8
	ethernet bool
	maxQPWr  int
	maxAtom  int
	maxCQE   int
}

// openDevice opens the device of sel.
func openDevice(sel selection) (*device, error) {
	var list **C.struct_ibv_device
	n := C.rm_device_list(&list)
	if n < 0 {
		return nil, fmt.Errorf("%w (ibv_get_device_list: %w)", ErrNoDevice, syscall.Errno(-n))
	}
	defer C.ibv_free_device_list(list)
	for i := range int(n) {
		if C.GoString(C.rm_device_name(list, C.int(i))) != sel.Name {
			continue
		}
		ctx, err := C.rm_open(list, C.int(i))
		if ctx == nil {
			return nil, fmt.Errorf("rdma: verbs: ibv_open_device %s: %w", sel.Name, err)
		}
		d := &device{ctx: ctx, name: sel.Name, port: sel.Port, gidIndex: sel.GIDIndex}
		var ports, maxWr, maxAtom, maxCQE, atomicCap C.int
		if rc := C.rm_query_device(ctx, &ports, &maxWr, &maxAtom, &maxCQE, &atomicCap); rc != 0 {
			d.close()
			return nil, errnoErr("ibv_query_device "+sel.Name, rc)
		}
		if atomicCap == C.IBV_ATOMIC_NONE {
			d.close()
			return nil, fmt.Errorf("rdma: verbs: device %s has no atomics (atomic_cap NONE)", sel.Name)
		}
		d.maxQPWr, d.maxAtom, d.maxCQE = int(maxWr), int(maxAtom), int(maxCQE)
		var lid C.uint16_t
		var mtu C.uint32_t
		var ngid, state, eth C.int
		if rc := C.rm_query_port(ctx, C.uint8_t(sel.Port), &lid, &mtu, &ngid, &state, &eth); rc != 0 {
			d.close()
			return nil, errnoErr(fmt.Sprintf("ibv_query_port %s/%d", sel.Name, sel.Port), rc)
		}
		d.lid, d.mtu, d.ethernet = uint16(lid), uint8(mtu), eth != 0
		if rc := C.rm_query_gid(ctx, C.uint8_t(sel.Port), C.int(sel.GIDIndex), (*C.uint8_t)(unsafe.Pointer(&d.gid[0]))); rc != 0 {
			d.close()
			return nil, errnoErr(fmt.Sprintf("ibv_query_gid %s/%d index %d", sel.Name, sel.Port, sel.GIDIndex), rc)
		}
		return d, nil
	}
	return nil, fmt.Errorf("%w (no device named %q)", ErrNoDevice, sel.Name)
}

func (d *device) close() {
	if d.ctx != nil {
		C.ibv_close_device(d.ctx)
		d.ctx = nil
	}
}

// endpoint returns the local side of qp for the peer.
func (d *device) endpoint(q *queuePair, depth int) endpoint {
	return endpoint{QPN: q.qpn, PSN: q.psn, LID: d.lid, MTU: d.mtu, GID: d.gid, Depth: uint32(depth)}
}

// protDomain is a protection domain.
type protDomain struct{ pd *C.struct_ibv_pd }

func (d *device) allocPD() (*protDomain, error) {
	pd, err := C.ibv_alloc_pd(d.ctx)
	if pd == nil {
		return nil, fmt.Errorf("rdma: verbs: ibv_alloc_pd: %w", err)
	}
	return &protDomain{pd: pd}, nil
}

func (p *protDomain) free() error {
	if p.pd == nil {
		return nil
	}
	rc := C.ibv_dealloc_pd(p.pd)
	p.pd = nil
	if rc != 0 {
		return errnoErr("ibv_dealloc_pd", rc)
	}
	return nil
}

// memRegion is a registered memory region.
type memRegion struct {
	mr         *C.struct_ibv_mr
	lkey, rkey uint32
}

func accessFlags(acc rdma.Access) C.int {
	f := C.int(0)
	if acc&rdma.AccessRead != 0 {
		f |= C.IBV_ACCESS_REMOTE_READ
	}
	if acc&rdma.AccessWrite != 0 {
		// Remote write needs local write.
		f |= C.IBV_ACCESS_REMOTE_WRITE | C.IBV_ACCESS_LOCAL_WRITE
	}
	if acc == rdma.AccessReadWrite {
		f |= C.IBV_ACCESS_REMOTE_ATOMIC
	}
	return f
}

// register registers mem, which must not be Go-managed memory (an mmap'd
// mapping), with remote access acc (0: local only); localWrite lets the
// device write it for local READ and atomic results.
func (p *protDomain) register(mem []byte, acc rdma.Access, localWrite bool) (*memRegion, error) {
	if len(mem) == 0 {
		return nil, errors.New("rdma: verbs: register of empty memory")
	}
	flags := accessFlags(acc)
	if localWrite {
		flags |= C.IBV_ACCESS_LOCAL_WRITE
	}
	mr, err := C.rm_reg_mr(p.pd, C.uintptr_t(uintptr(unsafe.Pointer(&mem[0]))), C.size_t(len(mem)), flags)
	if mr == nil {
		return nil, fmt.Errorf("rdma: verbs: ibv_reg_mr of %d bytes (check RLIMIT_MEMLOCK): %w", len(mem), err)
	}
	return &memRegion{mr: mr, lkey: uint32(C.rm_mr_lkey(mr)), rkey: uint32(C.rm_mr_rkey(mr))}, nil
}

func (m *memRegion) deregister() error {
	if m.mr == nil {
		return nil
	}
	rc := C.ibv_dereg_mr(m.mr)
	if rc != 0 {
		return errnoErr("ibv_dereg_mr", rc)
	}
	m.mr = nil
	return nil
}

// addrOf returns the address of b[0] (b is not Go-managed memory).
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// complQueue is a completion queue with its completion channel.
type complQueue struct {
	ch *C.struct_ibv_comp_channel
	cq *C.struct_ibv_cq
	fd int // the channel's fd, non-blocking
}

func (d *device) createCQ(n int) (*complQueue, error) {
	ch, err := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		return nil, fmt.Errorf("rdma: verbs: ibv_create_comp_channel: %w", err)
	}
	if rc := C.rm_nonblock(ch.fd); rc != 0 {
		C.ibv_destroy_comp_channel(ch)
		return nil, errnoErr("fcntl O_NONBLOCK", rc)
	}
	cq, err := C.rm_create_cq(d.ctx, C.int(n), ch)
	if cq == nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, fmt.Errorf("rdma: verbs: ibv_create_cq of %d entries: %w", n, err)
	}
	return &complQueue{ch: ch, cq: cq, fd: int(ch.fd)}, nil
}

func (c *complQueue) destroy() error {
	var errs []error
	if c.cq != nil {
		if rc := C.ibv_destroy_cq(c.cq); rc != 0 {
			errs = append(errs, errnoErr("ibv_destroy_cq", rc))
		}
		c.cq = nil
	}
	if c.ch != nil {
		if rc := C.ibv_destroy_comp_channel(c.ch); rc != 0 {
			errs = append(errs, errnoErr("ibv_destroy_comp_channel", rc))
		}
		c.ch = nil
	}
	return errors.Join(errs...)
}

// poll reaps up to len(out) completions; it does not allocate.
func (c *complQueue) poll(out []cWC) int {
	if len(out) == 0 {
		return 0
	}
	return int(C.rm_poll(c.cq, &out[0], C.int(len(out))))
}

// arm asks for an event on the channel at the next completion.
func (c *complQueue) arm() error {
	if rc := C.rm_arm(c.cq); rc != 0 {
		return errnoErr("ibv_req_notify_cq", rc)
	}
	return nil
}

// drainEvents consumes the channel's pending events.
func (c *complQueue) drainEvents() {
	for C.rm_get_event(c.ch) > 0 {
	}
}

// queuePair is an RC queue pair.
type queuePair struct {
	qp   *C.struct_ibv_qp
	qpn  uint32
	psn  uint32
	wrs  *C.struct_ibv_send_wr // depth preallocated send WRs (C memory)
	sges *C.struct_ibv_sge
	bad  C.int // out parameter of rm_post (a local would escape: one allocation per post)
}

// createQP makes an RC QP in INIT. Only a server's QP (remote) accepts
// remote READ, WRITE and atomics; a client's refuses them whatever its MRs
// allow.
func (d *device) createQP(pd *protDomain, cq *complQueue, depth int, psn uint32, remote bool) (*queuePair, error) {
	qp, err := C.rm_create_qp(pd.pd, cq.cq, C.int(depth))
	if qp == nil {
		return nil, fmt.Errorf("rdma: verbs: ibv_create_qp (RC, depth %d): %w", depth, err)
	}
	q := &queuePair{qp: qp, qpn: uint32(C.rm_qpn(qp)), psn: psn & 0xffffff}
	q.wrs = (*C.struct_ibv_send_wr)(C.calloc(C.size_t(depth), C.size_t(unsafe.Sizeof(C.struct_ibv_send_wr{}))))
	q.sges = (*C.struct_ibv_sge)(C.calloc(C.size_t(depth), C.size_t(unsafe.Sizeof(C.struct_ibv_sge{}))))
	if q.wrs == nil || q.sges == nil {
		q.destroy()
		return nil, errors.New("rdma: verbs: out of memory for send WRs")
	}
	r := C.int(0)
	if remote {
		r = 1
	}
	if rc := C.rm_qp_init(qp, C.uint8_t(d.port), r); rc != 0 {
		q.destroy()
		return nil, errnoErr("ibv_modify_qp INIT", rc)
	}
	return q, nil
}

// connect moves q to RTR then RTS towards the peer.
func (d *device) connect(q *queuePair, peer endpoint) error {
	mtu := min(d.mtu, peer.MTU)
	atom := min(d.maxAtom, 16)
	if atom < 1 {
		atom = 1
	}
	global := 0
	if d.ethernet || peer.LID == 0 {
		global = 1
	}
	rc := C.rm_qp_rtr(q.qp, C.uint8_t(d.port), C.int(global), C.int(d.gidIndex), C.uint32_t(mtu),
		C.uint32_t(peer.QPN), C.uint32_t(peer.PSN), C.uint16_t(peer.LID),
		(*C.uint8_t)(unsafe.Pointer(&peer.GID[0])), C.int(atom))
	if rc != 0 {
		return errnoErr("ibv_modify_qp RTR", rc)
	}
	if rc := C.rm_qp_rts(q.qp, C.uint32_t(q.psn), C.int(atom)); rc != 0 {
		return errnoErr("ibv_modify_qp RTS", rc)
	}
	return nil
}

// setError moves q to the error state: every outstanding request is
// flushed with IBV_WC_WR_FLUSH_ERR.
func (q *queuePair) setError() error {
	if rc := C.rm_qp_error(q.qp); rc != 0 {
		return errnoErr("ibv_modify_qp ERR", rc)
	}
	return nil
}

// post posts ws (at most the QP's depth). On error it returns how many were
// posted.
func (q *queuePair) post(ws []cWR) (int, error) {
	if len(ws) == 0 {
		return 0, nil
	}
	if rc := C.rm_post(q.qp, &ws[0], C.int(len(ws)), q.wrs, q.sges, &q.bad); rc != 0 {
		return int(q.bad), errnoErr("ibv_post_send", rc)
	}
	return len(ws), nil
}

func (q *queuePair) destroy() error {
	var err error
	if q.qp != nil {
		if rc := C.ibv_destroy_qp(q.qp); rc != 0 {
			err = errnoErr("ibv_destroy_qp", rc)
		}
		q.qp = nil
	}
	C.free(unsafe.Pointer(q.wrs))
	C.free(unsafe.Pointer(q.sges))
	q.wrs, q.sges = nil, nil
	return err
}

// setWR fills w for one request.
func setWR(w *cWR, id uint64, op rdma.Opcode, laddr uint64, n uint32, lkey uint32,
	raddr uint64, rkey uint32, cmp, swp uint64, signaled bool) {
	w.wr_id = C.uint64_t(id)
	w.laddr = C.uint64_t(laddr)
	w.raddr = C.uint64_t(raddr)
	w.cmp = C.uint64_t(cmp)
	w.swp = C.uint64_t(swp)
	w.len = C.uint32_t(n)
	w.lkey = C.uint32_t(lkey)
	w.rkey = C.uint32_t(rkey)
	w.op = C.uint32_t(op)
	w.signaled = 0
	if signaled {
		w.signaled = 1
	}
}

func wcID(w *cWC) uint64        { return uint64(w.wr_id) }
func wcStatus(w *cWC) uint32    { return uint32(w.status) }
func wcVendorErr(w *cWC) uint32 { return uint32(w.vendor_err) }
