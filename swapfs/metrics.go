package swapfs

import "github.com/prometheus/client_golang/prometheus"

var (
	descSize       = prometheus.NewDesc("rmem_swapfs_size_bytes", "Size of the swap file.", nil, nil)
	descSlabs      = prometheus.NewDesc("rmem_swapfs_slabs", "Pool slabs allocated for the swap file.", nil, nil)
	descWritten    = prometheus.NewDesc("rmem_swapfs_blocks_written", "Distinct 4 KiB blocks ever written.", nil, nil)
	descReqs       = prometheus.NewDesc("rmem_swapfs_requests_total", "READ and WRITE requests from the kernel.", []string{"op"}, nil)
	descReqBytes   = prometheus.NewDesc("rmem_swapfs_request_bytes_total", "Bytes read and written by the kernel.", []string{"op"}, nil)
	descPoolOps    = prometheus.NewDesc("rmem_swapfs_pool_ops_total", "rdma ops to pool slabs.", []string{"op"}, nil)
	descPoolBytes  = prometheus.NewDesc("rmem_swapfs_pool_bytes_total", "Bytes moved to and from pool slabs (once per op, whatever the replicas).", []string{"op"}, nil)
	descZeroBlocks = prometheus.NewDesc("rmem_swapfs_zero_blocks_total", "Never-written blocks read as zeros without traffic.", nil, nil)
	descRetries    = prometheus.NewDesc("rmem_swapfs_retries_total", "Batches retried because no replica was reachable.", nil, nil)
	descErrors     = prometheus.NewDesc("rmem_swapfs_errors_total", "Requests failed with EIO.", nil, nil)
	descChecksum   = prometheus.NewDesc("rmem_swapfs_checksum_errors_total", "Copies of blocks read from the pool that failed their checksum (repaired from another replica, or the READ failed with EIO).", nil, nil)
)

// Collector returns a Prometheus collector of the FS's Stats.
func (fs *FS) Collector() prometheus.Collector { return collector{fs} }

type collector struct{ fs *FS }

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSize, descSlabs, descWritten, descReqs, descReqBytes, descPoolOps,
		descPoolBytes, descZeroBlocks, descRetries, descErrors, descChecksum} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.fs.Stats()
	gauge := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter := func(d *prometheus.Desc, v uint64, lv ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	gauge(descSize, s.Size)
	gauge(descSlabs, s.Slabs)
	gauge(descWritten, s.BlocksWritten)
	counter(descReqs, s.Reads, "read")
	counter(descReqs, s.Writes, "write")
	counter(descReqBytes, s.ReadBytes, "read")
	counter(descReqBytes, s.WriteBytes, "write")
	counter(descPoolOps, s.PoolReadOps, "read")
	counter(descPoolOps, s.PoolWriteOps, "write")
	counter(descPoolBytes, s.PoolReadBytes, "read")
	counter(descPoolBytes, s.PoolWriteBytes, "write")
	counter(descZeroBlocks, s.ZeroBlocks)
	counter(descRetries, s.Retries)
	counter(descErrors, s.Errors)
	counter(descChecksum, s.ChecksumErrors)
}
