// Command seer is the e2e workload of the realnode tier: `seer report` prints, as one JSON line
// after the marker "GPUWEAVE-SEER ", what its container sees (character device nodes under /dev,
// the device cgroup's allow list, the environment, mount points, the MPS pipe directory and its
// control daemon's answer to one query), then stays up until it is stopped; `seer pause` is the
// pod sandbox's process. Built static (CGO_ENABLED=0) so that its image is this one file.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

type device struct {
	Path  string `json:"path"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
}

type mpsView struct {
	PipeDirectory string   `json:"pipeDirectory"`
	Entries       []string `json:"entries"`
	Error         string   `json:"error,omitempty"`
	// The control daemon's answer to get_default_active_thread_percentage over the pipe
	// directory's control socket (the simulated daemon's protocol: a command line, an answer
	// ended by a NUL byte), or why there is none.
	ThreadPercentage string `json:"defaultActiveThreadPercentage,omitempty"`
	ControlError     string `json:"controlError,omitempty"`
}

func askControl(dir, command string) (string, error) {
	conn, err := net.DialTimeout("unix", filepath.Join(dir, "control"), 5*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(command + "\n")); err != nil {
		return "", err
	}
	answer, err := bufio.NewReader(conn).ReadString(0)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(answer, "\x00"), nil
}

type report struct {
	Devices      []device          `json:"devices"`
	DeviceCgroup []string          `json:"deviceCgroup"`
	Env          map[string]string `json:"env"`
	Mounts       []string          `json:"mounts"`
	MPS          *mpsView          `json:"mps,omitempty"`
	Hostname     string            `json:"hostname"`
	CgroupMemory string            `json:"cgroupMemoryLimit,omitempty"`
}

func charDevices(root string) []device {
	var out []device
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Mode()&fs.ModeCharDevice == 0 {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		rdev := uint64(st.Rdev)
		major := uint32((rdev>>8)&0xfff) | uint32((rdev>>32)&^0xfff)
		minor := uint32(rdev&0xff) | uint32((rdev>>12)&^0xff)
		out = append(out, device{Path: p, Major: major, Minor: minor})
		return nil
	})
	return out
}

func lines(path string) []string {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

func mounts() []string {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 {
			out = append(out, fields[4])
		}
	}
	sort.Strings(out)
	return out
}

func mps() *mpsView {
	dir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	if dir == "" {
		return nil
	}
	view := &mpsView{PipeDirectory: dir, Entries: []string{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		view.Error = err.Error()
		return view
	}
	for _, e := range entries {
		view.Entries = append(view.Entries, e.Name())
	}
	if answer, err := askControl(dir, "get_default_active_thread_percentage"); err != nil {
		view.ControlError = err.Error()
	} else {
		view.ThreadPercentage = answer
	}
	return view
}

func see() report {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	host, _ := os.Hostname()
	memory := ""
	if raw, err := os.ReadFile("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		memory = strings.TrimSpace(string(raw))
	}
	return report{
		Devices:      charDevices("/dev"),
		DeviceCgroup: lines("/sys/fs/cgroup/devices/devices.list"),
		Env:          env,
		Mounts:       mounts(),
		MPS:          mps(),
		Hostname:     host,
		CgroupMemory: memory,
	}
}

func waitForStop() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}

func main() {
	mode := "report"
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "pause":
		waitForStop()
	case "report":
		raw, err := json.Marshal(see())
		if err != nil {
			fmt.Fprintln(os.Stderr, "seer:", err)
			os.Exit(1)
		}
		fmt.Printf("GPUWEAVE-SEER %s\n", raw)
		waitForStop()
	default:
		fmt.Fprintf(os.Stderr, "usage: seer [report|pause]\n")
		os.Exit(2)
	}
}
