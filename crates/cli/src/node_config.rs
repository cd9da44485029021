//! `drove node run --config FILE`: the node's settings from a TOML file, for a
//! service (the Debian package's unit runs `drove node run --config
//! /etc/drove/node.toml`).
//!
//! The keys are the `node run` flag names in snake_case (`data`, `zone`, `listen`,
//! `peer_listen`, `join`, `tls_dir`, `log_file`, ...): every flag may appear except
//! `config` itself. A value is a string, an integer, a float or a boolean, and is
//! checked exactly as the flag's value would be, by the same clap parser. A flag given
//! on the command line overrides the file's key. An unknown key or a bad value is an
//! error that names the file and the key.
use anyhow::{anyhow, Context, Result};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, FromArgMatches};
use std::path::Path;

use crate::node_cmd::RunArgs;

/// Merge the file named by `--config` (if any) into `args`, the `node run`
/// arguments parsed from the command line; `top` is the whole command line's
/// matches (the `node run` subcommand's are found in it).
pub fn apply(args: &mut RunArgs, top: &ArgMatches) -> Result<()> {
    let Some(path) = args.config.clone() else {
        return Ok(());
    };
    let run = top
        .subcommand_matches("node")
        .and_then(|m| m.subcommand_matches("run"))
        .ok_or_else(|| anyhow!("--config: not a `node run` command line"))?;
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("Cannot read the config file {}", path.display()))?;
    merge(args, run, &path, &text)
}

/// The `node run` command as clap builds it, without defaults or required
/// arguments: parsing one key with it yields that key and nothing else.
fn bare_command() -> Command {
    RunArgs::augment_args(Command::new("drove node run"))
        .no_binary_name(true)
        .disable_help_flag(true)
        .mut_args(|a| {
            a.default_value(None)
                .required(false)
                .required_unless_present(clap::builder::Resettable::<clap::Id>::Reset)
        })
}

/// Merge the config `text` (read from `path`) into `args`: every key not given on
/// the command line (`run`, the `node run` matches) sets its field.
pub fn merge(args: &mut RunArgs, run: &ArgMatches, path: &Path, text: &str) -> Result<()> {
    let file = path.display();
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        anyhow!(
            "{}: bad TOML: {}",
            syntax_place(text, &e, &file),
            e.message().trim()
        )
    })?;
    let cmd = bare_command();
    for (key, value) in &table {
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_id() == key.as_str() && a.get_long().is_some())
            .filter(|a| a.get_id() != "config")
            .ok_or_else(|| unknown_key(&cmd, &file, key))?;
        if run.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
            continue; // the command line wins
        }
        let long = arg.get_long().unwrap_or(key);
        let flag_only = !arg.get_action().takes_values();
        let mut argv = Vec::new();
        let scalar = |v: &toml::Value| -> Result<String> {
            match v {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                toml::Value::Boolean(b) => Ok(b.to_string()),
                other => Err(anyhow!(
                    "{file}: key `{key}`: expected a string, a number or a boolean, not {}",
                    other.type_str()
                )),
            }
        };
        match value {
            toml::Value::Boolean(b) if flag_only => {
                if *b {
                    argv.push(format!("--{long}"));
                }
            }
            _ if flag_only => {
                return Err(anyhow!(
                    "{file}: key `{key}`: expected true or false (it is a flag without a value)"
                ))
            }
            toml::Value::Array(items) => {
                let many = arg.get_num_args().is_some_and(|n| n.max_values() > 1);
                if !many {
                    return Err(anyhow!(
                        "{file}: key `{key}`: expected one value, not a list"
                    ));
                }
                for item in items {
                    argv.push(format!("--{long}={}", scalar(item)?));
                }
            }
            v => argv.push(format!("--{long}={}", scalar(v)?)),
        }
        let m = cmd
            .clone()
            .try_get_matches_from(&argv)
            .map_err(|e| anyhow!("{file}: key `{key}`: {}", clap_message(&e)))?;
        args.update_from_arg_matches(&m)
            .map_err(|e| anyhow!("{file}: key `{key}`: {}", clap_message(&e)))?;
    }
    if args.data.is_none() {
        return Err(anyhow!(
            "{file}: no data directory: set `data = \"/var/lib/drove\"` there or give --data DIR"
        ));
    }
    Ok(())
}

/// Where a TOML syntax error is: the file, line and column.
fn syntax_place(text: &str, e: &toml::de::Error, file: &impl std::fmt::Display) -> String {
    let Some(span) = e.span() else {
        return file.to_string();
    };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{file}, line {line}, column {col}")
}

/// The error for a key that is no `node run` flag, with the keys that are.
fn unknown_key(cmd: &Command, file: &impl std::fmt::Display, key: &str) -> anyhow::Error {
    let keys: Vec<&str> = cmd
        .get_arguments()
        .filter(|a| a.get_long().is_some() && a.get_id() != "config")
        .map(|a| a.get_id().as_str())
        .collect();
    let hint = if keys.contains(&key.replace('-', "_").as_str()) {
        format!(" (the keys are snake_case: `{}`)", key.replace('-', "_"))
    } else {
        String::new()
    };
    anyhow!(
        "{file}: unknown key `{key}`{hint}; the keys are the `drove node run` flags: {}",
        keys.join(", ")
    )
}

/// The first line of a clap error, without its "error: " prefix.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let line = text.lines().next().unwrap_or("").trim();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::path::PathBuf;

    /// `drove node run ARGV` merged with the config `text`.
    fn parse(argv: &[&str], text: &str) -> Result<RunArgs> {
        let cmd = RunArgs::augment_args(Command::new("run")).no_binary_name(true);
        let m = cmd.try_get_matches_from(argv)?;
        let mut a = RunArgs::from_arg_matches(&m)?;
        merge(&mut a, &m, Path::new("/etc/drove/node.toml"), text)?;
        Ok(a)
    }

    fn err(argv: &[&str], text: &str) -> String {
        match parse(argv, text) {
            Ok(_) => panic!("accepted {text:?}"),
            Err(e) => format!("{e:#}"),
        }
    }

    const FILE: &str = r#"
# every kind of key
data = "/var/lib/drove"
zone = "dc1"
listen = "0.0.0.0:7100"
peer_listen = "0.0.0.0:7201"
join = "10.0.0.1"
join_timeout = 5
weight = 200
max_voters = 5
lock_lease = 20
scrub_every = 0
nbd_handshake_timeout = 2.5
tls_dir = "/etc/drove/tls"
nbd_tls = "allow"
log_file = "/var/log/drove/node.log"
log_max_size = "1M"
log_keep = 7
"#;

    #[test]
    fn the_file_alone_sets_every_key() {
        let a = parse(&["--config", "x"], FILE).unwrap();
        assert_eq!(a.data, Some(PathBuf::from("/var/lib/drove")));
        assert_eq!(a.zone, "dc1");
        assert_eq!(a.listen, "0.0.0.0:7100".parse::<SocketAddr>().unwrap());
        assert_eq!(a.peer_listen, Some("0.0.0.0:7201".parse().unwrap()));
        assert_eq!(a.nbd_listen, None);
        assert_eq!(a.join.as_deref(), Some("10.0.0.1"));
        assert_eq!(a.join_timeout, 5);
        assert_eq!(a.weight, 200);
        assert_eq!(a.max_voters, 5);
        assert_eq!(a.lock_lease, 20);
        assert_eq!(a.scrub_every, 0);
        assert_eq!(a.nbd_handshake_timeout, 2.5);
        assert_eq!(a.tls_dir, Some(PathBuf::from("/etc/drove/tls")));
        assert_eq!(a.nbd_tls, Some(crate::node_cmd::NbdTls::Allow));
        assert_eq!(
            a.log.log_file,
            Some(PathBuf::from("/var/log/drove/node.log"))
        );
        assert_eq!(a.log.log_max_size, "1M");
        assert_eq!(a.log.log_keep, 7);
    }

    #[test]
    fn keys_left_out_keep_the_flag_defaults() {
        let a = parse(&["--config", "x"], "data = \"/d\"\n").unwrap();
        assert_eq!(a.zone, "z1");
        assert_eq!(a.listen, "127.0.0.1:7000".parse::<SocketAddr>().unwrap());
        assert_eq!(a.weight, 100);
        assert_eq!(a.log.log_max_size, "64M");
        assert_eq!(a.nbd_tls, None);
    }

    #[test]
    fn flags_override_the_file() {
        let a = parse(
            &[
                "--config",
                "x",
                "--zone",
                "cli-zone",
                "--weight=7",
                "--listen",
                "127.0.0.1:9000",
                "--log-keep",
                "1",
                "--data",
                "/cli",
            ],
            FILE,
        )
        .unwrap();
        assert_eq!(a.zone, "cli-zone");
        assert_eq!(a.weight, 7);
        assert_eq!(a.listen, "127.0.0.1:9000".parse::<SocketAddr>().unwrap());
        assert_eq!(a.log.log_keep, 1);
        assert_eq!(a.data, Some(PathBuf::from("/cli")));
        // The rest still comes from the file.
        assert_eq!(a.max_voters, 5);
        assert_eq!(a.log.log_max_size, "1M");
    }

    #[test]
    fn a_flag_equal_to_its_default_still_overrides_the_file() {
        let a = parse(&["--config", "x", "--zone", "z1"], FILE).unwrap();
        assert_eq!(a.zone, "z1");
    }

    #[test]
    fn an_unknown_key_is_refused_with_the_file_and_key() {
        let e = err(&["--config", "x"], "data = \"/d\"\nzones = \"a\"\n");
        assert!(
            e.contains("/etc/drove/node.toml: unknown key `zones`"),
            "{e}"
        );
        assert!(e.contains("tls_dir"), "lists the keys: {e}");
        let e = err(
            &["--config", "x"],
            "data = \"/d\"\npeer-listen = \"1.2.3.4:5\"\n",
        );
        assert!(e.contains("unknown key `peer-listen`"), "{e}");
        assert!(e.contains("snake_case: `peer_listen`"), "{e}");
        let e = err(&["--config", "x"], "config = \"/other.toml\"\n");
        assert!(e.contains("unknown key `config`"), "{e}");
    }

    #[test]
    fn a_bad_value_is_refused_with_the_file_and_key() {
        let e = err(&["--config", "x"], "listen = \"not an address\"\n");
        assert!(
            e.contains("/etc/drove/node.toml: key `listen`: invalid value 'not an address'"),
            "{e}"
        );
        let e = err(&["--config", "x"], "weight = -3\n");
        assert!(e.contains("key `weight`"), "{e}");
        let e = err(&["--config", "x"], "weight = \"heavy\"\n");
        assert!(e.contains("key `weight`: invalid value 'heavy'"), "{e}");
        let e = err(&["--config", "x"], "nbd_tls = \"maybe\"\n");
        assert!(e.contains("key `nbd_tls`: invalid value 'maybe'"), "{e}");
        let e = err(&["--config", "x"], "zone = [\"a\", \"b\"]\n");
        assert!(
            e.contains("key `zone`: expected one value, not a list"),
            "{e}"
        );
        let e = err(&["--config", "x"], "[zone]\nname = \"a\"\n");
        assert!(e.contains("key `zone`: expected a string"), "{e}");
    }

    #[test]
    fn a_syntax_error_names_the_file_and_line() {
        let e = err(&["--config", "x"], "data = \"/d\"\nzone = dc1\n");
        assert!(e.contains("/etc/drove/node.toml, line 2"), "{e}");
    }

    #[test]
    fn a_value_that_looks_like_a_flag_is_a_value() {
        let a = parse(&["--config", "x"], "data = \"/d\"\nzone = \"--weird\"\n").unwrap();
        assert_eq!(a.zone, "--weird");
    }

    #[test]
    fn the_data_directory_must_come_from_somewhere() {
        let e = err(&["--config", "x"], "zone = \"a\"\n");
        assert!(e.contains("no data directory"), "{e}");
        assert!(parse(&["--config", "x", "--data", "/d"], "zone = \"a\"\n").is_ok());
        // Without --config, clap itself asks for --data.
        let cmd = RunArgs::augment_args(Command::new("run")).no_binary_name(true);
        assert!(cmd.try_get_matches_from(["--zone", "a"]).is_err());
    }

    #[test]
    fn the_shipped_default_file_is_valid() {
        let text = include_str!("../../../packaging/deb/node.toml");
        let a = parse(&["--config", "x"], text).unwrap();
        assert_eq!(a.data, Some(PathBuf::from("/var/lib/drove")));
    }
}
