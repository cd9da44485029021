//! Telling a silent peer from a slow one, without sockets or clocks (the caller
//! passes `now`), so the decisions are unit-tested.
//!
//! A peer that stops answering without closing its sockets (a hung host, a process
//! stopped by SIGSTOP, a cable cut on the far side) once held every write for the
//! peer pool's fixed 10 s request timeout. Now each connection watches how long its
//! peer has said nothing while requests wait: after [`Liveness::probe_after`] of
//! quiet it sends a ping (a live peer answers it at once, however long its disk
//! takes with the requests themselves); after [`Liveness::silent_after`] of quiet it
//! gives the peer up, and the requests waiting on it fail at once. The gateway then
//! has the replica marked down and acknowledges the write without it, as it does for
//! any failed replica.
//!
//! Both times derive from the peer's measured round trip (pings, smoothed as TCP
//! does: `srtt` and `rttvar`), never below a floor: on a LAN the floor decides; over
//! a WAN link whose round trip is 100 ms, the peer gets at least 8 round trips.
use std::time::{Duration, Instant};

/// The default floor of [`Liveness::silent_after`]. 500 ms gave a healthy peer up
/// once in a five-minute run beside two CPU hogs on a 2-core machine; one second
/// did not, and still keeps the longest pause of a write near one second.
pub const DEFAULT_SILENCE_FLOOR: Duration = Duration::from_secs(1);

/// The longest a peer may stay silent with requests waiting, whatever its history.
pub const MAX_SILENCE: Duration = Duration::from_secs(10);

/// A smoothed round-trip time (RFC 6298's estimator).
#[derive(Debug, Clone, Copy, Default)]
pub struct Rtt {
    srtt: Option<Duration>,
    rttvar: Duration,
}

impl Rtt {
    /// Take one sample.
    pub fn sample(&mut self, rtt: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(s) => {
                let diff = s.abs_diff(rtt);
                self.rttvar = (self.rttvar * 3 + diff) / 4;
                self.srtt = Some((s * 7 + rtt) / 8);
            }
        }
    }

    /// The smoothed round trip, once measured.
    pub fn smoothed(&self) -> Option<Duration> {
        self.srtt
    }

    /// A round trip that is unusually long for this peer: `srtt + 4 rttvar`.
    pub fn high(&self) -> Option<Duration> {
        self.srtt.map(|s| s + self.rttvar * 4)
    }
}

/// What a connection's watchdog should do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing: no request waits, or the peer spoke recently.
    Wait,
    /// Send a ping: requests wait and the peer has been quiet a while.
    Probe,
    /// Give the peer up: requests wait and it said nothing for this long.
    Silent(Duration),
}

/// How long a peer may be quiet while requests wait on it.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    /// Quiet time after which the peer is given up.
    pub silent_after: Duration,
    /// Quiet time after which a ping is sent.
    pub probe_after: Duration,
}

impl Liveness {
    /// The times for a peer with round trip `rtt`, never under `floor`.
    pub fn for_peer(rtt: &Rtt, floor: Duration) -> Liveness {
        let silent_after = rtt
            .high()
            .map_or(floor, |h| (h * 8).max(floor))
            .min(MAX_SILENCE.max(floor));
        Liveness {
            silent_after,
            probe_after: silent_after / 3,
        }
    }

    /// Judge a connection at `now`: `oldest` is when the oldest waiting request was
    /// sent (`None`: nothing waits), `heard` when the peer last sent anything, and
    /// `probing` whether a ping is out unanswered. Quiet time counts from the later
    /// of the two: a request sent to a peer idle for an hour is not late at once.
    pub fn judge(
        &self,
        now: Instant,
        oldest: Option<Instant>,
        heard: Instant,
        probing: bool,
    ) -> Verdict {
        let Some(oldest) = oldest else {
            return Verdict::Wait;
        };
        let quiet = now.saturating_duration_since(oldest.max(heard));
        if quiet >= self.silent_after {
            Verdict::Silent(quiet)
        } else if quiet >= self.probe_after && !probing {
            Verdict::Probe
        } else {
            Verdict::Wait
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn test_the_floor_decides_on_a_lan_the_round_trip_over_a_wan() {
        let floor = 500 * MS;
        let mut lan = Rtt::default();
        assert_eq!(
            Liveness::for_peer(&lan, floor).silent_after,
            floor,
            "unmeasured"
        );
        for _ in 0..20 {
            lan.sample(MS / 5);
        }
        assert_eq!(Liveness::for_peer(&lan, floor).silent_after, floor);
        let mut wan = Rtt::default();
        for _ in 0..20 {
            wan.sample(100 * MS);
        }
        let l = Liveness::for_peer(&wan, floor);
        assert!(l.silent_after >= 800 * MS, "{l:?}");
        assert_eq!(l.probe_after, l.silent_after / 3);
        let mut awful = Rtt::default();
        awful.sample(Duration::from_secs(30));
        assert_eq!(Liveness::for_peer(&awful, floor).silent_after, MAX_SILENCE);
    }

    #[test]
    fn test_rtt_follows_samples_and_tracks_their_spread() {
        let mut r = Rtt::default();
        r.sample(10 * MS);
        assert_eq!(r.smoothed(), Some(10 * MS));
        for _ in 0..50 {
            r.sample(20 * MS);
        }
        let s = r.smoothed().unwrap();
        assert!(s > 19 * MS && s <= 20 * MS, "{s:?}");
        assert!(r.high().unwrap() < 22 * MS, "steady samples, small spread");
    }

    #[test]
    fn test_quiet_is_counted_from_the_later_of_the_request_and_the_last_word() {
        let l = Liveness {
            silent_after: 600 * MS,
            probe_after: 200 * MS,
        };
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Nothing waits: never late, however long the peer has been quiet.
        assert_eq!(l.judge(at(100_000), None, t0, false), Verdict::Wait);
        // A request sent now to a peer last heard an hour ago is not late.
        assert_eq!(
            l.judge(at(100_050), Some(at(100_000)), t0, false),
            Verdict::Wait
        );
        // Quiet for 250 ms since the request: ping, once.
        assert_eq!(
            l.judge(at(100_250), Some(at(100_000)), t0, false),
            Verdict::Probe
        );
        assert_eq!(
            l.judge(at(100_300), Some(at(100_000)), t0, true),
            Verdict::Wait
        );
        // The ping's answer (heard at 100_320) resets the quiet: a slow disk is not
        // a silent peer.
        assert_eq!(
            l.judge(at(100_700), Some(at(100_000)), at(100_320), false),
            Verdict::Probe
        );
        // No answer at all: given up at 600 ms.
        assert_eq!(
            l.judge(at(100_650), Some(at(100_000)), t0, true),
            Verdict::Silent(650 * MS)
        );
    }
}
