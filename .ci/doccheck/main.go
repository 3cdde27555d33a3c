// Command doccheck fails if an exported name of the packages in the given directories has no
// doc comment, or one that does not start with its name (optionally after "A", "An" or "The"),
// as pkg.go.dev readers expect. Exported struct fields need a comment too. Test files are not
// read. Usage: go run ./.ci/doccheck DIR...
package main

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	bad := 0
	report := func(dir, what, problem string) {
		fmt.Printf("%s: %s: %s\n", dir, what, problem)
		bad++
	}
	for _, dir := range os.Args[1:] {
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			panic(err)
		}
		fset := token.NewFileSet()
		var files []*ast.File
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			files = append(files, f)
		}
		p, err := doc.NewFromFiles(fset, files, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if p.Doc == "" {
			report(dir, "package "+p.Name, "no package doc")
		}
		// check reports the doc comment text of name, shown as label, if it is missing or does
		// not start with the name.
		check := func(label, name, text string) {
			words := strings.Fields(text)
			switch {
			case len(words) == 0:
				report(dir, label, "no doc comment")
			case words[0] == name:
			case len(words) > 1 && (words[0] == "A" || words[0] == "An" || words[0] == "The") && words[1] == name:
			default:
				report(dir, label, fmt.Sprintf("doc comment starts %q, not with the name", words[0]))
			}
		}
		values := func(vs []*doc.Value) {
			for _, v := range vs {
				if v.Doc != "" {
					continue
				}
				for _, s := range v.Decl.Specs {
					vs := s.(*ast.ValueSpec)
					for _, n := range vs.Names {
						if n.IsExported() && vs.Doc == nil && vs.Comment == nil {
							report(dir, "value "+n.Name, "no doc comment")
						}
					}
				}
			}
		}
		for _, f := range p.Funcs {
			check("func "+f.Name, f.Name, f.Doc)
		}
		values(p.Consts)
		values(p.Vars)
		for _, t := range p.Types {
			check("type "+t.Name, t.Name, t.Doc)
			for _, f := range t.Funcs {
				check("func "+f.Name, f.Name, f.Doc)
			}
			for _, m := range t.Methods {
				check("method "+t.Name+"."+m.Name, m.Name, m.Doc)
			}
			values(t.Consts)
			values(t.Vars)
			for _, s := range t.Decl.Specs {
				st, ok := s.(*ast.TypeSpec).Type.(*ast.StructType)
				if !ok {
					continue
				}
				for _, fl := range st.Fields.List {
					for _, n := range fl.Names {
						if n.IsExported() && fl.Doc == nil && fl.Comment == nil {
							report(dir, "field "+t.Name+"."+n.Name, "no doc comment")
						}
					}
				}
			}
		}
	}
	if bad > 0 {
		fmt.Printf("%d exported names without a proper doc comment\n", bad)
		os.Exit(1)
	}
}
