// The pod sandbox's process (the role of Kubernetes' build/pause/linux/pause.c, which no module proxy carries):
// sleeps until SIGINT or SIGTERM and reaps the zombies of processes reparented to it (it is PID 1 of the pod's
// PID namespace when that is shared). Built static (CGO_ENABLED=0) by harness/cluster/build.sh.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
