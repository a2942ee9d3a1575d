// Package chaos runs the pool as a cluster of hosts on one machine, each
// in its own network namespace (ip netns) with a veth on a bridge and a
// real address: three etcd members (the Debian etcd-server binary), three
// coordinators (memd --role coordinator --store etcd://...), three memory
// servers, an agent host running `memagent run` of a C program that pages
// at 25% local memory, and an observer host the tests' own clients dial
// from. Its tests inject faults (kill -9, nftables partitions, link down,
// SIGSTOP, and delay/loss through faultproxy) and check that the programs
// finish with exact checksums, no page lost, and no two leaders writing.
// TestMain prints a table of the scenarios and their recovery times.
//
// The tests skip, saying why, without root, iproute2 with network
// namespaces, etcd, gcc or userfaultfd. Namespaces are named
// rmemha-<pid>-<host> and deleted at the end of each test (and, if a run
// was killed, by the next run).
package chaos
