package metricsagent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sync"

	"sigs.k8s.io/yaml"

	"github.com/wasm-epp/wasm-epp/scheduler/wire"
)

// FileObjectSource reads InferencePool, InferenceObjective and
// InferenceModelRewrite objects from one multi-document YAML file (the
// same YAML kubectl would apply), for tests and local runs without a
// cluster. The agent reads the file again at the start of every cycle
// (Poll), so a change is pushed by that very cycle; each change gets a new
// revision, above the last and at least the file's modification time, so a
// restarted agent reading a changed file is ahead of its previous run.
type FileObjectSource struct {
	path    string
	changed chan struct{}

	mu                          sync.Mutex
	raw                         []byte
	pools, objectives, rewrites [][]byte
	rev                         uint64
	loaded                      bool
}

// NewFileObjectSource reads path once; an unreadable or malformed file is an
// error here, and later only reported by Poll (the previous objects are
// kept).
func NewFileObjectSource(path string) (*FileObjectSource, error) {
	s := &FileObjectSource{path: path, changed: make(chan struct{}, 1)}
	if _, err := s.Poll(); err != nil {
		return nil, err
	}
	return s, nil
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// Poll reads the file and reports whether its objects changed.
func (s *FileObjectSource) Poll() (bool, error) {
	raw, err := os.ReadFile(s.path)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	same := s.loaded && bytes.Equal(raw, s.raw)
	s.mu.Unlock()
	if same {
		return false, nil
	}
	var pools, objectives, rewrites [][]byte
	for i, doc := range docSeparator.Split(string(raw), -1) {
		if len(bytes.TrimSpace(stripYAMLComments([]byte(doc)))) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return false, fmt.Errorf("%s: document %d: %w", s.path, i+1, err)
		}
		var env envelope
		if err := json.Unmarshal(js, &env); err != nil {
			return false, fmt.Errorf("%s: document %d: %w", s.path, i+1, err)
		}
		switch env.Kind {
		case KindInferencePool:
			pools = append(pools, js)
		case KindInferenceObjective:
			objectives = append(objectives, js)
		case KindInferenceModelRewrite:
			rewrites = append(rewrites, js)
		default:
			return false, fmt.Errorf("%s: document %d: kind %q is not InferencePool, InferenceObjective or InferenceModelRewrite", s.path, i+1, env.Kind)
		}
	}
	var mtime uint64
	if fi, err := os.Stat(s.path); err == nil {
		mtime = uint64(fi.ModTime().UnixNano())
	}
	s.mu.Lock()
	s.raw, s.pools, s.objectives, s.rewrites = raw, pools, objectives, rewrites
	s.rev = max(s.rev+1, mtime)
	s.loaded = true
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return true, nil
}

func stripYAMLComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, line...)
			out = append(out, '\n')
		}
	}
	return out
}

// Snapshot implements ObjectSource: every resource has the file's revision.
func (s *FileObjectSource) Snapshot() (pools, objectives, rewrites [][]byte, rev wire.ConfigRevision, synced bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pools, s.objectives, s.rewrites, wire.ConfigRevision{Pools: s.rev, Objectives: s.rev, Rewrites: s.rev}, s.loaded
}

// Changed implements ObjectSource.
func (s *FileObjectSource) Changed() <-chan struct{} { return s.changed }
