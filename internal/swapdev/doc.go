// Package swapdev turns a file into active swap the way the kernel accepts
// a FUSE file: a loop device with direct I/O (losetup --direct-io=on),
// mkswap and swapon; and undoes it (swapoff, losetup --detach). It finds
// the loop devices backed by a file in /sys/block/loop*/loop/backing_file
// and the active swap areas in /proc/swaps.
//
// Why a loop device: swapon on the FUSE file itself fails ("swapfile has
// holes"). Why direct I/O: without it swap-ins are served from the loop
// device's page cache of the file and no memory is freed.
//
// It runs the util-linux commands rather than the ioctls so that what it
// does is what an administrator would type; a failing command is reported
// with its command line and output (*CommandError).
//
// It is NOT the filesystem (swapfs) and keeps no state: everything is read
// back from the kernel, so a restarted memagent finds what an earlier one
// set up.
package swapdev
