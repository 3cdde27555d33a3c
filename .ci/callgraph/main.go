// Command callgraph prints which files of a package call functions declared in which other files,
// and fails if the files call each other in a cycle: each path through the library (submission,
// expiry, the manual clock) should read in one direction. Test files are not read; build tags
// are those of an ordinary build. Usage: go run ./.ci/callgraph DIR
package main

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"sort"
)

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	pkg, err := build.ImportDir(dir, 0)
	if err != nil {
		fail(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			fail(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	if _, err := conf.Check(pkg.ImportPath, fset, files, info); err != nil {
		fail(err)
	}
	fileOf := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	edges := map[string]map[string][]string{} // caller file -> callee file -> names
	for id, obj := range info.Uses {
		fn, ok := obj.(*types.Func)
		if !ok || fn.Pkg() == nil || fn.Pkg().Path() != pkg.ImportPath || !fn.Pos().IsValid() {
			continue
		}
		from, to := fileOf(id.Pos()), fileOf(fn.Pos())
		if from == to {
			continue
		}
		if edges[from] == nil {
			edges[from] = map[string][]string{}
		}
		if !slices.Contains(edges[from][to], fn.Name()) {
			edges[from][to] = append(edges[from][to], fn.Name())
		}
	}
	names := []string{}
	for _, n := range pkg.GoFiles {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, from := range names {
		var tos []string
		for to := range edges[from] {
			tos = append(tos, to)
		}
		sort.Strings(tos)
		for _, to := range tos {
			fns := edges[from][to]
			sort.Strings(fns)
			fmt.Printf("%s -> %s: %v\n", from, to, fns)
		}
	}
	// Tarjan's strongly connected components: any with more than one file is a cycle.
	index, low, onStack := map[string]int{}, map[string]int{}, map[string]bool{}
	var stack []string
	var cycles [][]string
	next := 0
	var visit func(string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for w := range edges[v] {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var comp []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp = append(comp, w)
				if w == v {
					break
				}
			}
			if len(comp) > 1 {
				sort.Strings(comp)
				cycles = append(cycles, comp)
			}
		}
	}
	for _, n := range names {
		if _, seen := index[n]; !seen {
			visit(n)
		}
	}
	if len(cycles) > 0 {
		for _, c := range cycles {
			fmt.Printf("cycle: %v\n", c)
		}
		os.Exit(1)
	}
	fmt.Println("no cycles between files")
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "callgraph:", err)
	os.Exit(2)
}
