package liveness

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const modulePath = "example.invalid/liveness/clients/go"

// A program in a module of its own, outside this repository, builds against this directory
// with the README's commands: a go.work naming both, or a replace line. Nothing is fetched
// (GOPROXY=off): the module is used from the source tree, as a user of a checkout would.
func TestAProgramOutsideTheRepositoryBuildsAgainstIt(t *testing.T) {
	here, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	program, err := os.ReadFile(filepath.Join(here, "examples/consumer/main.go"))
	if err != nil {
		t.Fatal(err)
	}
	for name, link := range map[string][][]string{
		"go.work": {{"work", "init", ".", here}},
		"replace": {{"mod", "edit", "-require=" + modulePath + "@v0.0.0", "-replace=" + modulePath + "=" + here}},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "main.go"), program, 0o644); err != nil {
				t.Fatal(err)
			}
			steps := append([][]string{{"mod", "init", "example.com/consumer"}}, link...)
			steps = append(steps, []string{"build", "-o", "consumer", "."})
			for _, args := range steps {
				cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=", "GOWORK=")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, "consumer")); err != nil {
				t.Fatal(err)
			}
		})
	}
}
