// Package metricnames tells the deployment's tests (the chart's alert rules,
// the Grafana dashboard) which Prometheus series the services publish, so
// that a query naming a metric that does not exist fails a test instead of
// showing an empty panel or an alert that never fires.
//
// It reads the collectors each service package declares in its metrics.go
// (house style: one file per package), as Go source.
package metricnames

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Declared returns every series name the packages under root/pkg publish:
// each collector's name, and for a histogram its _bucket, _sum and _count.
func Declared(root string) (map[string]bool, error) {
	files, err := filepath.Glob(filepath.Join(root, "pkg", "*", "metrics.go"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no pkg/*/metrics.go under %s", root)
	}
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			sel, ok := lit.Type.(*ast.SelectorExpr)
			if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
				return true
			}
			for _, elt := range lit.Elts {
				kv, ok := elt.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				key, ok := kv.Key.(*ast.Ident)
				val, isLit := kv.Value.(*ast.BasicLit)
				if !ok || key.Name != "Name" || !isLit || val.Kind != token.STRING {
					continue
				}
				name, err := strconv.Unquote(val.Value)
				if err != nil {
					continue
				}
				out[name] = true
				if sel.Sel.Name == "HistogramOpts" {
					for _, s := range []string{"_bucket", "_sum", "_count"} {
						out[name+s] = true
					}
				}
			}
			return true
		})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no collector names in %s", strings.Join(files, ", "))
	}
	return out, nil
}

var seriesName = regexp.MustCompile(`\bstillthere_[a-z0-9_]+\b`)

// Referenced returns the stillthere_ series a PromQL expression names, in
// order, each with the index in expr just past it (where its label
// matchers start, if it has any).
func Referenced(expr string) (names []string, ends []int) {
	for _, loc := range seriesName.FindAllStringIndex(expr, -1) {
		names = append(names, expr[loc[0]:loc[1]])
		ends = append(ends, loc[1])
	}
	return names, ends
}
