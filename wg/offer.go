package wg

import (
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// One reading of the device serves both its readers on a leader: the
// health probes read the counters every second (Stats, for the tunnels to
// the other leaders), and the watch reads them every second too while
// kg-run peers are applied (the half-dead session rule) or while the
// device has no change feed (drift). Stats offers its reading to the
// watch, which takes it in place of its own next read when it reads about
// that often anyway (every QuietInterval, not the fast session readings):
// the same device state, a read less. While it reads slowly and the last reading was offered, it
// waits a quarter interval more for the next offer before it reads itself:
// the probes' ticker and its own timer would otherwise fall due together,
// and it would read a moment before each offer. Beside kg, the Lease holder's two reads a second were a third
// of its idle CPU and most of its device process's
// (docs/performance.md#beside-kg).

// offer is a reading Stats took.
type offer struct {
	dev *wgtypes.Device
	at  time.Time
	// writes: Manager.writes before the reading; the offer is stale once
	// this process wrote the device again (a drift check against the new
	// memory would see the old device).
	writes uint64
}

// configure writes cfg to the device; the caller holds m.mu.
func (m *Manager) configure(cfg wgtypes.Config) error {
	m.writes++
	return m.client.ConfigureDevice(m.iface, cfg)
}

// keepOffer keeps d, read when m.writes was writes, for the watch, if it
// runs and nothing was written meanwhile.
func (m *Manager) keepOffer(d *wgtypes.Device, writes uint64) {
	m.mu.Lock()
	if m.watchClock == nil || m.writes != writes {
		m.mu.Unlock()
		return
	}
	m.offer = &offer{dev: d, at: m.watchClock.Now(), writes: writes}
	m.mu.Unlock()
	select {
	case m.offered <- struct{}{}:
	default:
	}
}

// takeOffer returns the reading offered since the last call, if it is
// still the device as this process last wrote it; the caller holds m.mu.
func (m *Manager) takeOffer() *offer {
	o := m.offer
	m.offer = nil
	if o == nil || o.writes != m.writes {
		return nil
	}
	return o
}
