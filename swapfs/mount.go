package swapfs

import (
	"fmt"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// FSType is the filesystem type of the mount as /proc/self/mountinfo shows
// it ("fuse." + the go-fuse Name).
const FSType = "fuse.rmemswap"

// Mount mounts fs on dir with mount(2) (root; fusermount is not used) and
// serves it in the background until Unmount. Requests are up to 1 MiB.
func Mount(dir string, fs *FS) (*fuse.Server, error) {
	srv, err := fuse.NewServer(fs, dir, &fuse.MountOptions{
		FsName:             "rmem",
		Name:               "rmemswap",
		DirectMountStrict:  true,
		AllowOther:         true,
		MaxWrite:           MaxRequest,
		MaxBackground:      64,
		DisableXAttrs:      true,
		DisableReadDirPlus: true,
		DisableSplice:      true, // data is in memory already
	})
	if err != nil {
		return nil, fmt.Errorf("swapfs: mount %s: %w", dir, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		srv.Unmount()
		return nil, fmt.Errorf("swapfs: mount %s: %w", dir, err)
	}
	return srv, nil
}
