package verbs

import (
	"fmt"
	"net"
	"os"
	"strconv"
)

// Config chooses the RDMA device. The zero value selects automatically: the
// device and GID whose address is the local IP address of the control
// connection (RoCE), else the first active port.
type Config struct {
	// Device is a device name as ibv_devices lists it (e.g. "rxe0",
	// "mlx5_0"); empty: automatic.
	Device string
	// Port is the port number (0: automatic, else 1-based).
	Port int
	// GIDIndex is the GID table index to use (-1 or unset via env:
	// automatic; on RoCE the index holding the IPv4-mapped address, which
	// is 1 on rxe; on InfiniBand 0).
	GIDIndex int
}

// ConfigFromEnv reads RMEM_VERBS_DEVICE, RMEM_VERBS_PORT and
// RMEM_VERBS_GID_INDEX; unset variables select automatically.
func ConfigFromEnv() (Config, error) {
	c := Config{Device: os.Getenv("RMEM_VERBS_DEVICE"), GIDIndex: -1}
	if s := os.Getenv("RMEM_VERBS_PORT"); s != "" {
		p, err := strconv.Atoi(s)
		if err != nil || p < 1 || p > 255 {
			return c, fmt.Errorf("rdma: verbs: RMEM_VERBS_PORT=%q: want a port number 1..255", s)
		}
		c.Port = p
	}
	if s := os.Getenv("RMEM_VERBS_GID_INDEX"); s != "" {
		g, err := strconv.Atoi(s)
		if err != nil || g < 0 || g > 65535 {
			return c, fmt.Errorf("rdma: verbs: RMEM_VERBS_GID_INDEX=%q: want an index 0..65535", s)
		}
		c.GIDIndex = g
	}
	return c, nil
}

// devInfo describes one port of one device, for selection.
type devInfo struct {
	Name     string
	Port     uint8
	Ethernet bool
	State    int // enum ibv_port_state; 4 = ACTIVE
	GIDs     [][16]byte
}

// selection is one device port and GID index.
type selection struct {
	Name     string
	Port     uint8
	GIDIndex int
}

const portActive = 4 // IBV_PORT_ACTIVE

// choose picks the device port and GID for local address ip among devs.
// It is a plain function over what listDevices found, so it is tested
// without hardware.
func choose(devs []devInfo, ip net.IP, c Config) (selection, error) {
	var want [16]byte
	haveIP := false
	if ip16 := ip.To16(); ip16 != nil && !ip.IsUnspecified() {
		want, haveIP = [16]byte(ip16), true
	}
	match := func(d devInfo) bool {
		return (c.Device == "" || d.Name == c.Device) && (c.Port == 0 || int(d.Port) == c.Port)
	}
	// 1. An explicit GID index.
	if c.GIDIndex >= 0 {
		for _, d := range devs {
			if match(d) && c.GIDIndex < len(d.GIDs) {
				return selection{d.Name, d.Port, c.GIDIndex}, nil
			}
		}
		return selection{}, fmt.Errorf("%w (no device%s%s with GID index %d)", ErrNoDevice, nameOf(c), portOf(c), c.GIDIndex)
	}
	// 2. The GID that is the control connection's address (RoCE).
	if haveIP {
		for _, d := range devs {
			if !match(d) {
				continue
			}
			for i, g := range d.GIDs {
				if g == want {
					return selection{d.Name, d.Port, i}, nil
				}
			}
		}
	}
	// 3. An active InfiniBand port (GID 0), or a named device's first
	// IPv4-mapped GID, else its first non-zero GID.
	for _, d := range devs {
		if !match(d) || d.State != portActive {
			continue
		}
		if !d.Ethernet && len(d.GIDs) > 0 {
			return selection{d.Name, d.Port, 0}, nil
		}
		if c.Device != "" {
			// RoCE v2 over IPv4 first: the GID is an IPv4-mapped address.
			for i, g := range d.GIDs {
				if net.IP(g[:]).To4() != nil && g != [16]byte{} {
					return selection{d.Name, d.Port, i}, nil
				}
			}
			for i, g := range d.GIDs {
				if g != [16]byte{} {
					return selection{d.Name, d.Port, i}, nil
				}
			}
		}
	}
	if haveIP {
		return selection{}, fmt.Errorf("%w (no device%s%s serves %s: no GID holds it; for Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)",
			ErrNoDevice, nameOf(c), portOf(c), ip)
	}
	return selection{}, fmt.Errorf("%w (no active port%s%s)", ErrNoDevice, nameOf(c), portOf(c))
}

func nameOf(c Config) string {
	if c.Device == "" {
		return ""
	}
	return " " + strconv.Quote(c.Device)
}

func portOf(c Config) string {
	if c.Port == 0 {
		return ""
	}
	return " port " + strconv.Itoa(c.Port)
}
