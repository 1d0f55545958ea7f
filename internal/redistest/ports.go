package redistest

import (
	"errors"
	"net"
	"sync"
)

// clusterBusOffset is the distance from a cluster node's port to its
// cluster bus port.
const clusterBusOffset = 10000

// maxClusterPort is the highest port a cluster node may use, so that its
// bus port is still a valid port.
const maxClusterPort = 65535 - clusterBusOffset

var (
	portsMu sync.Mutex
	// handedOut holds every port freePort returned in this process, so that
	// two servers of one test binary never race for the same port. Other
	// processes can still take a port; Start retries then.
	handedOut = map[int]bool{}
)

// freePort returns a loopback port that was free a moment ago. With
// withBus, port+10000 was free too and is below 65536.
func freePort(withBus bool) (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		port, err := listenFree(0)
		if err != nil {
			return 0, err
		}
		if handedOut[port] || port == 6379 {
			continue
		}
		if withBus {
			bus := port + clusterBusOffset
			if port > maxClusterPort || handedOut[bus] || bus == 6379 {
				continue
			}
			if _, err := listenFree(bus); err != nil {
				continue
			}
			handedOut[bus] = true
		}
		handedOut[port] = true
		return port, nil
	}
	return 0, errors.New("redistest: found no free loopback port")
}

// listenFree listens on 127.0.0.1:port (0: any), closes the listener and
// returns the port.
func listenFree(port int) (int, error) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
