package endtoend

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// groupMembers lists the live processes (not zombies) whose process group
// is one of groups, from /proc.
func groupMembers(groups []int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		s := string(b)
		// pid (comm) state ppid pgrp ...; comm may hold spaces.
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		pgrp, err := strconv.Atoi(f[2])
		if err != nil || !slices.Contains(groups, pgrp) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		out = append(out, pid)
	}
	return out
}

func gatewayEnv() string { return os.Getenv(envGateway) }
