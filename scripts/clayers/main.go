// Command clayers draws the dependency picture of a folder of C files by
// file: which file uses (calls, reads, writes, takes the address of) a
// symbol defined in which other file, from the symbol tables of the object
// files (each .c compiled alone with -c), and, given the files' layers from
// top to bottom, the uses that run back up: from a file to one in a layer
// above it, or between files of one layer both ways.
//
//	go run ./scripts/clayers -max 1 -prefix rm_ preload/src 'fork.c' 'interpose.c' ...
//
// Each argument after the folder is one layer: file names separated by
// spaces; a .c file in no layer is an error. It exits 1 when more file
// pairs run back up than -max allows, or, with -prefix, when a symbol
// shared between files (global, hidden) does not start with the prefix;
// exported symbols (default visibility) are listed, not checked.
//
// It sees what the compiler emits: a use inlined from a header counts for
// the file that includes it; a call through a function pointer does not
// count.
package main

import (
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	maxBack := flag.Int("max", 0, "file pairs whose uses may run back up")
	quiet := flag.Bool("q", false, "print only the uses that run back up, and the problems")
	prefix := flag.String("prefix", "", "the prefix of every hidden symbol shared between files")
	cflags := flag.String("cflags", "-O2 -fPIC -pthread -fvisibility=hidden", "compiler flags (CC picks the compiler, default gcc)")
	flag.Parse()
	if flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: clayers [-max N] [-q] [-prefix P] [-cflags FLAGS] DIR [LAYER...]")
		os.Exit(2)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	objs, err := compile(cc, strings.Fields(*cflags), flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "clayers:", err)
		os.Exit(2)
	}
	back, bad, err := run(os.Stdout, objs, flag.Args()[1:], *prefix, *quiet)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clayers:", err)
		os.Exit(2)
	}
	fail := false
	if back > *maxBack {
		fmt.Fprintf(os.Stderr, "clayers: %d file pairs run back up, %d allowed\n", back, *maxBack)
		fail = true
	}
	if bad > 0 {
		fmt.Fprintf(os.Stderr, "clayers: %d shared symbols without the prefix %q\n", bad, *prefix)
		fail = true
	}
	if fail {
		os.Exit(1)
	}
}

// compile builds each .c file of dir into an object file of a temporary
// folder; it returns their symbols by source name.
func compile(cc string, cflags []string, dir string) (map[string]symbols, error) {
	srcs, err := filepath.Glob(filepath.Join(dir, "*.c"))
	if err != nil || len(srcs) == 0 {
		return nil, fmt.Errorf("no .c files in %s", dir)
	}
	tmp, err := os.MkdirTemp("", "clayers")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	objs := map[string]symbols{}
	for _, src := range srcs {
		name := filepath.Base(src)
		obj := filepath.Join(tmp, strings.TrimSuffix(name, ".c")+".o")
		args := append(append([]string{}, cflags...), "-c", "-o", obj, src)
		if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, out)
		}
		f, err := elf.Open(obj)
		if err != nil {
			return nil, err
		}
		s, err := read(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %v", obj, err)
		}
		objs[name] = s
	}
	return objs, nil
}

// symbols is what one object file defines and uses.
type symbols struct {
	defs   map[string]bool // global, defined here
	hidden map[string]bool // the defs of hidden (not default) visibility
	uses   map[string]bool // undefined here
}

func read(f *elf.File) (symbols, error) {
	s := symbols{defs: map[string]bool{}, hidden: map[string]bool{}, uses: map[string]bool{}}
	syms, err := f.Symbols()
	if err != nil {
		return s, err
	}
	for _, sym := range syms {
		bind := elf.ST_BIND(sym.Info)
		if sym.Name == "" || (bind != elf.STB_GLOBAL && bind != elf.STB_WEAK) {
			continue
		}
		if sym.Section == elf.SHN_UNDEF {
			s.uses[sym.Name] = true
			continue
		}
		s.defs[sym.Name] = true
		if elf.ST_VISIBILITY(sym.Other) != elf.STV_DEFAULT {
			s.hidden[sym.Name] = true
		}
	}
	return s, nil
}

func run(w io.Writer, files map[string]symbols, layers []string, prefix string, quiet bool) (back, bad int, err error) {
	definer := map[string]string{}
	var names []string
	for name, s := range files {
		names = append(names, name)
		for d := range s.defs {
			if other, ok := definer[d]; ok {
				return 0, 0, fmt.Errorf("%s is defined in %s and %s", d, other, name)
			}
			definer[d] = name
		}
	}
	sort.Strings(names)
	layer := map[string]int{}
	for i, l := range layers {
		for _, f := range strings.Fields(l) {
			if _, ok := files[f]; !ok {
				return 0, 0, fmt.Errorf("layer %d names %s, which is not there", i+1, f)
			}
			layer[f] = i
		}
	}
	if len(layers) > 0 {
		for _, n := range names {
			if _, ok := layer[n]; !ok {
				return 0, 0, fmt.Errorf("%s is in no layer", n)
			}
		}
	}
	// edges[from][to] = the symbols of to that from uses
	edges := map[string]map[string][]string{}
	for _, f := range names {
		for u := range files[f].uses {
			t, ok := definer[u]
			if !ok || t == f {
				continue
			}
			if edges[f] == nil {
				edges[f] = map[string][]string{}
			}
			edges[f][t] = append(edges[f][t], u)
		}
	}
	for _, f := range names {
		var tos []string
		for t := range edges[f] {
			tos = append(tos, t)
		}
		sort.Slice(tos, func(i, j int) bool {
			if layer[tos[i]] != layer[tos[j]] {
				return layer[tos[i]] < layer[tos[j]]
			}
			return tos[i] < tos[j]
		})
		for _, t := range tos {
			mark := ""
			if len(layers) > 0 {
				switch lf, lt := layer[f], layer[t]; {
				case lt < lf:
					mark = "  BACK UP"
					back++
				case lt == lf && edges[t][f] != nil && f < t:
					mark = "  BOTH WAYS (one layer)"
					back++
				}
			}
			syms := edges[f][t]
			sort.Strings(syms)
			if !quiet || mark != "" {
				fmt.Fprintf(w, "%-12s -> %-12s %s%s\n", f, t, strings.Join(syms, " "), mark)
			}
		}
	}
	if prefix != "" {
		var exported []string
		for _, f := range names {
			var defs []string
			for d := range files[f].defs {
				defs = append(defs, d)
			}
			sort.Strings(defs)
			for _, d := range defs {
				switch {
				case !files[f].hidden[d]:
					exported = append(exported, d)
				case !strings.HasPrefix(d, prefix):
					fmt.Fprintf(w, "%-12s defines %s: a shared symbol without the prefix %s\n", f, d, prefix)
					bad++
				}
			}
		}
		if !quiet {
			sort.Strings(exported)
			fmt.Fprintf(w, "exported: %s\n", strings.Join(exported, " "))
		}
	}
	if len(layers) > 0 {
		fmt.Fprintf(w, "%d file pairs run back up\n", back)
	}
	return back, bad, nil
}
