// Command filedeps draws the dependency picture of one Go package by file:
// which file's code calls (or takes) functions and methods declared in which
// other file (tests excluded), and, given the package's
// layers from top to bottom, the uses that run back up: from a file to one
// in a layer above it, or between files of one layer both ways.
//
//	go run ./scripts/filedeps -max 3 ./pager 'agent.go resume.go metrics.go' 'loop.go' ...
//
// Each argument after the package is one layer: file names separated by
// spaces; a file in no layer is reported. It exits 1 when more uses run
// back up than -max allows, so that a layering can be kept by make.
//
// It is a reading aid, not a linter: it sees the uses the type checker
// resolves (calls through interfaces count for the interface's file).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	maxBack := flag.Int("max", 0, "uses that may run back up")
	quiet := flag.Bool("q", false, "print only the uses that run back up")
	flag.Parse()
	if flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: filedeps [-max N] [-q] PKG [LAYER...]")
		os.Exit(2)
	}
	back, err := run(os.Stdout, flag.Arg(0), flag.Args()[1:], *quiet)
	if err != nil {
		fmt.Fprintln(os.Stderr, "filedeps:", err)
		os.Exit(2)
	}
	if back > *maxBack {
		fmt.Fprintf(os.Stderr, "filedeps: %d uses run back up, %d allowed\n", back, *maxBack)
		os.Exit(1)
	}
}

// listed is what `go list -json` says of a package.
type listed struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
}

func goList(args ...string) ([]listed, error) {
	out, err := exec.Command("go", append([]string{"list", "-json"}, args...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w", strings.Join(args, " "), err)
	}
	var ps []listed
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p listed
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func run(w io.Writer, pkg string, layers []string, quiet bool) (back int, err error) {
	top, err := goList(pkg)
	if err != nil || len(top) != 1 {
		return 0, fmt.Errorf("%s: %v", pkg, err)
	}
	deps, err := goList("-export", "-deps", pkg)
	if err != nil {
		return 0, err
	}
	exports := map[string]string{}
	for _, d := range deps {
		exports[d.ImportPath] = d.Export
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range top[0].GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(top[0].Dir, name), nil, 0)
		if err != nil {
			return 0, err
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if exports[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(exports[path])
	})}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	tpkg, err := conf.Check(top[0].ImportPath, fset, files, info)
	if err != nil {
		return 0, err
	}
	// edges[from][to] = names used
	edges := map[string]map[string]map[string]bool{}
	for id, obj := range info.Uses {
		if _, ok := obj.(*types.Func); !ok || obj.Pkg() != tpkg {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to || to == "" {
			continue
		}
		if edges[from] == nil {
			edges[from] = map[string]map[string]bool{}
		}
		if edges[from][to] == nil {
			edges[from][to] = map[string]bool{}
		}
		edges[from][to][obj.Name()] = true
	}
	layer := map[string]int{}
	for i, l := range layers {
		for _, f := range strings.Fields(l) {
			layer[f] = i
		}
	}
	var froms []string
	for f := range edges {
		froms = append(froms, f)
	}
	sort.Strings(froms)
	for _, f := range froms {
		var tos []string
		for t := range edges[f] {
			tos = append(tos, t)
		}
		sort.Strings(tos)
		for _, t := range tos {
			mark := ""
			if len(layers) > 0 {
				lf, okf := layer[f]
				lt, okt := layer[t]
				switch {
				case !okf || !okt:
					mark = "  (not in a layer)"
					back++
				case lt < lf:
					mark = "  BACK UP"
					back++
				case lt == lf && edges[t][f] != nil && f < t:
					mark = "  BOTH WAYS (one layer)"
					back++
				}
			}
			var names []string
			for n := range edges[f][t] {
				names = append(names, n)
			}
			sort.Strings(names)
			if !quiet || mark != "" {
				fmt.Fprintf(w, "%-18s -> %-18s %s%s\n", f, t, strings.Join(names, " "), mark)
			}
		}
	}
	if len(layers) > 0 {
		fmt.Fprintf(w, "%d uses run back up\n", back)
	}
	return back, nil
}
