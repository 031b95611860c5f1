package wg

import (
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
	"k8s.io/utils/clock"
)

// One reading of the device serves both its readers on a leader: the
// health probes read the counters every second (Stats, for the tunnels to
// the other leaders), and the watch reads them every second too while
// kg-run peers are applied (the half-dead session rule) or while the
// device has no change feed (drift). Stats offers its reading to the
// watch, which takes it in place of its own next read when it reads about
// that often anyway (every QuietInterval, not the fast session readings):
// the same device state, a read less. While it reads slowly and the last
// reading was offered, it waits a quarter interval more for the next offer
// before it reads itself: the probes' ticker and its own timer would
// otherwise fall due together, and it would read a moment before each
// offer. Beside kg, the Lease holder's two to three reads a second were a
// third of its idle CPU and most of its device process's
// (docs/performance.md#beside-kg).
//
// Stats never waits for m.mu (an apply holds it while it resolves
// endpoint names): the write count is atomic and the offer has its own
// lock.

// offer is a reading Stats took.
type offer struct {
	dev *wgtypes.Device
	// at: when the read began, so that a reading begun before the
	// watch's own last read is not taken as newer.
	at time.Time
	// writes: Manager.writes when the read began; the offer is stale once
	// this process wrote the device again (a drift check against the new
	// memory would see the old device).
	writes uint64
}

// configure writes cfg to the device; the caller holds m.mu. writes is
// odd while the write goes out (a sequence lock): a reading begun then
// may be the device before it, and is not offered.
func (m *Manager) configure(cfg wgtypes.Config) error {
	m.writes.Add(1)
	defer m.writes.Add(1)
	return m.client.ConfigureDevice(m.iface, cfg)
}

// offerClock is the watch's clock, nil while no watch runs (nothing is
// offered then).
func (m *Manager) offerClock() clock.Clock {
	m.offerMu.Lock()
	defer m.offerMu.Unlock()
	return m.watchClock
}

// keepOffer keeps d, whose read began at with m.writes at writes, for the
// watch, if no write was going out then nor since.
func (m *Manager) keepOffer(d *wgtypes.Device, at time.Time, writes uint64) {
	m.offerMu.Lock()
	if writes%2 != 0 || m.writes.Load() != writes {
		m.offerMu.Unlock()
		return
	}
	m.offer = &offer{dev: d, at: at, writes: writes}
	m.offerMu.Unlock()
	select {
	case m.offered <- struct{}{}:
	default:
	}
}

// takeOffer returns the reading offered since the last call, if it is
// still the device as this process last wrote it and began after since
// (the watch's last reading).
func (m *Manager) takeOffer(since time.Time) *offer {
	m.offerMu.Lock()
	o := m.offer
	m.offer = nil
	m.offerMu.Unlock()
	if o == nil || o.writes != m.writes.Load() || !o.at.After(since) {
		return nil
	}
	return o
}
