//! Figures as perftest reports them: bandwidth in Gb/s (10^9 bits) and MB/s (2^20 octets),
//! message rate in Mpps; latency t_min, t_typical (the median), t_avg, t_max and percentiles,
//! in microseconds.

use std::time::Duration;

/// Octets per "MB" in perftest's `BW average[MB/sec]` column.
pub const MB: f64 = 1_048_576.0;

/// A bandwidth measurement.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Bw {
    /// Messages moved.
    pub iters: u64,
    /// Octets moved.
    pub bytes: u64,
    /// Wall time from the first post to the last completion (delivery confirmed).
    pub seconds: f64,
    /// Bandwidth, 10^9 bits per second.
    pub gbit_s: f64,
    /// Bandwidth, 2^20 octets per second.
    pub mbyte_s: f64,
    /// Messages per second, millions.
    pub mpps: f64,
    /// Octets sent that never arrived (a raw UDP baseline that lost datagrams: its
    /// figures are over what arrived).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_bytes: u64,
    /// perftest's BW peak, Gb/s: the best rate over any stretch of the run that retired at
    /// least a window of messages ([`Peak`]); RDMA rows only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_gbit_s: Option<f64>,
}

/// Tracks the best bandwidth over any stretch of a run that retired at least `window`
/// messages (perftest's "BW peak"; a stretch shorter than the requests in flight would only
/// measure how completions bunch up).
#[derive(Debug)]
pub struct Peak {
    window: u64,
    size: u64,
    /// (time, messages retired by then), oldest first; only what a later stretch can start at.
    marks: std::collections::VecDeque<(std::time::Instant, u64)>,
    best: f64,
}

impl Peak {
    /// For `size`-octet messages, over stretches of at least `window` messages.
    pub fn new(size: u32, window: u64, start: std::time::Instant) -> Peak {
        let mut marks = std::collections::VecDeque::new();
        marks.push_back((start, 0));
        Peak {
            window: window.max(1),
            size: u64::from(size),
            marks,
            best: 0.0,
        }
    }

    /// `retired` messages were done at `at`.
    pub fn mark(&mut self, at: std::time::Instant, retired: u64) {
        // The latest start that still leaves a full window gives this end its best rate.
        while self.marks.len() > 1 && retired - self.marks[1].1 >= self.window {
            self.marks.pop_front();
        }
        if let Some(&(t0, r0)) = self.marks.front()
            && retired - r0 >= self.window
        {
            let dt = at.duration_since(t0).as_secs_f64().max(1e-9);
            self.best = self
                .best
                .max(((retired - r0) * self.size) as f64 * 8.0 / dt / 1e9);
        }
        self.marks.push_back((at, retired));
    }

    /// The best rate seen, Gb/s (`None` when no stretch was long enough).
    pub fn gbit_s(&self) -> Option<f64> {
        (self.best > 0.0).then_some(self.best)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Bw {
    /// `iters` messages of `size` octets in `elapsed`.
    pub fn new(iters: u64, size: u32, elapsed: Duration) -> Bw {
        Bw::of_octets(iters * u64::from(size), size, elapsed)
    }

    /// `bytes` octets of `size`-octet messages in `elapsed` (the last message may be
    /// partial: a lossy baseline counts what arrived).
    pub fn of_octets(bytes: u64, size: u32, elapsed: Duration) -> Bw {
        Bw::rated(bytes / u64::from(size.max(1)), bytes, elapsed.as_secs_f64())
    }

    /// `iters` messages, `bytes` octets in `seconds`: the rates.
    fn rated(iters: u64, bytes: u64, seconds: f64) -> Bw {
        let seconds = seconds.max(1e-9);
        Bw {
            iters,
            bytes,
            seconds,
            gbit_s: bytes as f64 * 8.0 / seconds / 1e9,
            mbyte_s: bytes as f64 / seconds / MB,
            mpps: iters as f64 / seconds / 1e6,
            lost_bytes: 0,
            peak_gbit_s: None,
        }
    }
}

impl Bw {
    /// A measurement as its parts came over the wire (`-b`'s other direction).
    pub fn from_parts(
        iters: u64,
        bytes: u64,
        seconds: f64,
        lost_bytes: u64,
        peak_gbit_s: Option<f64>,
    ) -> Bw {
        Bw {
            lost_bytes,
            peak_gbit_s,
            ..Bw::rated(iters, bytes, seconds)
        }
    }

    /// Two measurements taken at the same time (`-b`'s two directions): their octets and
    /// messages over the longer of their times.
    pub fn plus(&self, o: &Bw) -> Bw {
        Bw {
            lost_bytes: self.lost_bytes + o.lost_bytes,
            // Both directions at their best at once is an upper bound, not a measurement.
            peak_gbit_s: self.peak_gbit_s.zip(o.peak_gbit_s).map(|(a, b)| a + b),
            ..Bw::rated(
                self.iters + o.iters,
                self.bytes + o.bytes,
                self.seconds.max(o.seconds),
            )
        }
    }
}

/// A latency distribution, microseconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Lat {
    /// Samples.
    pub iters: u64,
    /// Smallest.
    pub t_min: f64,
    /// Median (perftest's t_typical).
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Largest.
    pub t_max: f64,
    /// Standard deviation.
    pub t_stdev: f64,
    /// 99th percentile.
    pub t_p99: f64,
    /// 99.9th percentile.
    pub t_p999: f64,
}

impl Lat {
    /// Statistics of `samples` (nanoseconds), each divided by `div` (2 for half round
    /// trips); `None` without samples.
    pub fn from_nanos(samples: &mut [u64], div: f64) -> Option<Lat> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let us = |ns: u64| ns as f64 / 1000.0 / div;
        let n = samples.len();
        let pct = |p: f64| {
            // perftest: the sample at index ceil(p * n) - 1.
            let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            us(samples[i])
        };
        let avg = samples.iter().map(|&s| us(s)).sum::<f64>() / n as f64;
        let var = samples.iter().map(|&s| (us(s) - avg).powi(2)).sum::<f64>() / n as f64;
        Some(Lat {
            iters: n as u64,
            t_min: us(samples[0]),
            t_typical: us(samples[n / 2]),
            t_avg: avg,
            t_max: us(samples[n - 1]),
            t_stdev: var.sqrt(),
            t_p99: pct(0.99),
            t_p999: pct(0.999),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_units() {
        let b = Bw::new(1000, 65536, Duration::from_secs(1));
        assert_eq!(b.bytes, 65_536_000);
        assert!((b.mbyte_s - 62.5).abs() < 1e-9);
        assert!((b.gbit_s - 0.524288).abs() < 1e-9);
        assert!((b.mpps - 0.001).abs() < 1e-12);
    }

    #[test]
    fn latency_percentiles() {
        let mut s: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        s.reverse();
        let l = Lat::from_nanos(&mut s, 2.0).unwrap();
        assert_eq!(l.t_min, 0.5);
        assert_eq!(l.t_max, 500.0);
        assert_eq!(l.t_typical, 250.5);
        assert_eq!(l.t_p99, 495.0);
        assert!((l.t_avg - 250.25).abs() < 1e-9);
        assert!(Lat::from_nanos(&mut [], 1.0).is_none());
    }
}

#[cfg(test)]
mod peak_tests {
    use super::Peak;
    use std::time::{Duration, Instant};

    /// 1000-octet messages: 10 per ms for 50 ms, then 40 per ms for 5 ms, then 10 per ms
    /// again. Over stretches of 100 messages the best is the fast one: 40 × 8000 bits/ms.
    #[test]
    fn peak_is_the_fastest_stretch_of_a_full_window() {
        let t0 = Instant::now();
        let mut p = Peak::new(1000, 100, t0);
        let (mut t, mut r) = (Duration::ZERO, 0u64);
        for (ms, per_ms) in [(50, 10), (5, 40), (50, 10)] {
            for _ in 0..ms {
                t += Duration::from_millis(1);
                r += per_ms;
                p.mark(t0 + t, r);
            }
        }
        let fast = 40.0 * 8000.0 / 1e-3 / 1e9;
        let got = p.gbit_s().unwrap();
        assert!((got - fast).abs() < 1e-9, "{got} vs {fast}");
        // A run shorter than the window has no peak.
        let mut short = Peak::new(1000, 100, t0);
        short.mark(t0 + Duration::from_millis(1), 99);
        assert_eq!(short.gbit_s(), None);
    }
}
