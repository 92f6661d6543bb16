//! CPU time of a process (user + system) from `/proc/PID/stat`, to charge a run's work to the server.

use anyhow::{bail, Context, Result};

/// User plus system CPU seconds consumed so far by process `pid` (`None`: this process).
pub fn cpu_seconds(pid: Option<u32>) -> Result<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let ticks = parse_stat_ticks(&text).with_context(|| format!("parsing {path}"))?;
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if per_second <= 0 {
        bail!("sysconf(_SC_CLK_TCK) failed");
    }
    Ok(ticks as f64 / per_second as f64)
}

/// utime + stime (fields 14 and 15) in clock ticks.
fn parse_stat_ticks(text: &str) -> Result<u64> {
    // The command name (field 2) is in parentheses and may itself contain spaces and ')'.
    let after_comm = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .context("no ')' after the command name")?;
    // after_comm starts at field 3 (state), so utime and stime are its 12th and 13th fields.
    let mut fields = after_comm.split_ascii_whitespace().skip(11);
    let mut next = |name: &str| -> Result<u64> {
        fields
            .next()
            .with_context(|| format!("missing {name}"))?
            .parse::<u64>()
            .with_context(|| format!("bad {name}"))
    };
    Ok(next("utime")? + next("stime")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utime_and_stime_are_summed_even_with_odd_command_names() {
        let line = "4242 (mem cached) x) S 1 4242 4242 0 -1 4194560 213 0 0 0 1234 56 0 0 20 0 3 0";
        assert_eq!(parse_stat_ticks(line).unwrap(), 1290);
        assert!(parse_stat_ticks("4242 (cut) S 1 2").is_err());
    }

    #[test]
    fn own_cpu_time_is_readable() {
        assert!(cpu_seconds(None).unwrap() >= 0.0);
    }
}
