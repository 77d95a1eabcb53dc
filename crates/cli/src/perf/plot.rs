//! `softrdma perf --plot FILE.svg`: the run drawn as two charts side by side — bandwidth
//! against message size and latency against message size, softrdma's operations beside the
//! raw socket baseline of the same run — with `plotters` into an SVG file.

use std::path::Path;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;

use super::proto::Test;
use super::{PerfError, Report};

/// One line: its name, colour and (size, value) points.
type Series = (String, RGBColor, Vec<(f64, f64)>);

const WRITE: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const READ: RGBColor = RGBColor(0xd6, 0x27, 0x28);
const SEND: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const RAW: RGBColor = RGBColor(0x44, 0x44, 0x44);
const GSO: RGBColor = RGBColor(0x99, 0x99, 0x99);

fn colour(t: Test) -> RGBColor {
    match t {
        Test::WriteBw | Test::WriteLat => WRITE,
        Test::ReadBw | Test::ReadLat => READ,
        _ => SEND,
    }
}

/// Adds `(x, y)` to the series named `name`.
fn push(series: &mut Vec<Series>, name: &str, c: RGBColor, x: f64, y: f64) {
    match series.iter_mut().find(|s| s.0 == name) {
        Some(s) => s.2.push((x, y)),
        None => series.push((name.to_owned(), c, vec![(x, y)])),
    }
}

/// The bandwidth and latency series of `r`.
fn series(r: &Report) -> (Vec<Series>, Vec<Series>) {
    let base = if r.transport == "roce" {
        "raw UDP"
    } else {
        "raw TCP"
    };
    let (mut bw, mut lat) = (Vec::new(), Vec::new());
    for b in &r.bw {
        let x = f64::from(b.bytes);
        push(&mut bw, b.test.name(), colour(b.test), x, b.rdma.gbit_s);
        push(&mut bw, base, RAW, x, b.raw_tcp.gbit_s);
        if let Some(g) = b.raw_udp_gso {
            push(&mut bw, "raw UDP GSO", GSO, x, g.gbit_s);
        }
    }
    for l in &r.lat {
        let x = f64::from(l.bytes);
        push(&mut lat, l.test.name(), colour(l.test), x, l.rdma.t_typical);
        // Read is a round trip, Send and Write half of one: the baseline on each basis.
        let (raw, c) = if l.basis == "round_trip" {
            (format!("{base} round trip"), GSO)
        } else {
            (format!("{base} half round trip"), RAW)
        };
        push(&mut lat, &raw, c, x, l.raw_tcp.t_typical);
    }
    for s in bw.iter_mut().chain(lat.iter_mut()) {
        s.2.sort_by(|a, b| a.0.total_cmp(&b.0));
        s.2.dedup_by(|a, b| a.0 == b.0);
    }
    (bw, lat)
}

/// Draws `r` into the SVG file `path`.
pub fn plot(r: &Report, path: &Path) -> Result<(), PerfError> {
    let (bw, lat) = series(r);
    if bw.is_empty() && lat.is_empty() {
        return Err(PerfError::Usage(
            "--plot: the run has no bandwidth or latency rows to draw".into(),
        ));
    }
    let fail = |e: String| PerfError::Usage(format!("--plot {}: {e}", path.display()));
    let root = SVGBackend::new(path, (1280, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let title = format!(
        "softrdma perf, {} {} ({}), beside {}",
        if r.transport == "roce" {
            "RoCEv2"
        } else {
            "iWARP"
        },
        r.mode,
        r.device,
        if r.transport == "roce" {
            "raw UDP"
        } else {
            "raw TCP"
        }
    );
    let root = root
        .titled(&title, ("sans-serif", 22))
        .map_err(|e| fail(e.to_string()))?;
    let (left, right) = root.split_horizontally(640);
    chart(&left, "bandwidth", "Gb/s", &bw).map_err(fail)?;
    chart(&right, "latency (median)", "µs", &lat).map_err(fail)?;
    root.present().map_err(|e| fail(e.to_string()))?;
    Ok(())
}

/// One chart: message size on a log₂ axis, `unit` on a linear (bandwidth) or log (latency)
/// axis.
fn chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    what: &str,
    unit: &str,
    series: &[Series],
) -> Result<(), String> {
    let pts = || series.iter().flat_map(|s| s.2.iter());
    if series.is_empty() {
        return area
            .draw_text(
                &format!("no {what} rows in this run"),
                &("sans-serif", 16).into_text_style(area),
                (40, 40),
            )
            .map_err(|e| e.to_string());
    }
    let (x0, x1) = pts().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = pts().fold((f64::MAX, 0f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
    // Widen single points into a visible range.
    let (x0, x1) = (x0 / 1.5, x1 * 1.5);
    let caption = format!("{what} [{unit}] vs message size [octets]");
    let mut b = ChartBuilder::on(area);
    b.caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60);
    let x = (x0..x1).log_scale().base(2.0);
    if what == "bandwidth" {
        let y = 0f64..(y1 * 1.1).max(1e-3);
        draw(
            &mut b.build_cartesian_2d(x, y).map_err(|e| e.to_string())?,
            unit,
            series,
        )
    } else {
        let y = ((y0 / 1.5).max(1e-3)..y1 * 1.5).log_scale();
        draw(
            &mut b.build_cartesian_2d(x, y).map_err(|e| e.to_string())?,
            unit,
            series,
        )
    }
}

/// The mesh (sizes as perftest users write them, `unit` up the side), the series as lines
/// with points, and their legend.
fn draw<'a, DB, X, Y>(
    c: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    unit: &str,
    series: &[Series],
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let x_fmt = |v: &f64| size_label(*v);
    c.configure_mesh()
        .x_desc("message size")
        .y_desc(unit)
        .x_label_formatter(&x_fmt)
        .draw()
        .map_err(|e| e.to_string())?;
    for (name, colour, pts) in series {
        let colour = *colour;
        c.draw_series(LineSeries::new(pts.iter().copied(), colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| e.to_string())?;
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())
}

/// 65536 → "64K", 8388608 → "8M".
fn size_label(v: f64) -> String {
    let v = v.round() as u64;
    match v {
        _ if v >= 1 << 20 && v.is_multiple_of(1 << 20) => format!("{}M", v >> 20),
        _ if v >= 1 << 10 && v.is_multiple_of(1 << 10) => format!("{}K", v >> 10),
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::size_label;

    #[test]
    fn sizes_read_as_perftest_users_write_them() {
        assert_eq!(size_label(2.0), "2");
        assert_eq!(size_label(1000.0), "1000");
        assert_eq!(size_label(4096.0), "4K");
        assert_eq!(size_label(8388608.0), "8M");
    }
}
