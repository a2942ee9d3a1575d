package main

// The rdma providers memagent can reach memory servers with (--network).
// Without the verbs build tag, rmem/rdma/verbs registers a stand-in whose
// Dial names the missing tag.
import (
	_ "rmem/rdma/shm" // same-host data plane
	_ "rmem/rdma/tcp" // the default data plane
	_ "rmem/rdma/verbs"
)
