//! `drove vdi ...`: the VDI table.
use anyhow::Result;
use clap::Subcommand;
use drove_daemon::api::{CreateVdi, Resize, VdiDetail};
use drove_types::{format_size, parse_size, ReplicationMode, VdiInfo, MAX_COPIES};

use crate::client::{print_json, Ctx};
use crate::table;

#[derive(Subcommand)]
pub enum VdiCmd {
    /// Create a VDI; SIZE takes K/M/G/T/P suffixes (e.g. 10G; at most 1P).
    Create {
        /// Name; also the NBD export name.
        name: String,
        /// Size, e.g. 1G.
        size: String,
        /// Copies of every object (1..=5); the cluster default when omitted.
        #[arg(long)]
        copies: Option<u8>,
        /// How writes reach the replicas: `direct` (gateway to all at once) or
        /// `primary-copy` (gateway to the first, which forwards).
        #[arg(long, default_value = "direct")]
        mode: String,
        /// Replicas that must have a write while others are down (default: copies - 1,
        /// at least 1); below it writes fail instead of losing redundancy further.
        #[arg(long)]
        min_copies: Option<u8>,
        /// The zone (datacenter) that keeps `--home-copies` of every object, where the
        /// VM runs: its writes and reads stay there. Default: the zone of the node
        /// that first takes the VDI's write lock.
        #[arg(long, value_name = "ZONE")]
        home_zone: Option<String>,
        /// Copies kept in the home zone (1..=copies; default min(2, copies), fewer if
        /// the zone has fewer nodes); the others go to other zones, one per zone.
        #[arg(long, value_name = "N")]
        home_copies: Option<u8>,
        #[command(flatten)]
        policy: crate::policy_cmd::PolicyArgs,
    },
    /// List every VDI (snapshots and clones too), or those whose name matches GLOB.
    List {
        /// Only names matching this shell pattern: `*` any characters, `?` one,
        /// `[abc]` one of a set (quote it so the shell does not expand it).
        #[arg(long, value_name = "GLOB")]
        filter: Option<String>,
    },
    /// Bytes allocated per VDI and snapshot: per copy and on all replicas. With NAME,
    /// that VDI and the snapshots it was made from.
    Du {
        /// Only this VDI and its parent snapshots.
        name: Option<String>,
    },
    /// Show one VDI and how to attach it.
    Info {
        /// Name.
        name: String,
    },
    /// The clients that have a VDI open, on every node: who, since when, whether
    /// they wrote.
    Status {
        /// Name.
        name: String,
    },
    /// Delete a VDI and its data. Refused while clients have it open (they are
    /// named), unless --force. A snapshot that other VDIs still read from (the disk
    /// it was taken of, clones) is deleted without copying: its name goes at once and
    /// its blocks stay for them until nothing reads them; --flatten copies its data
    /// into them first instead, freeing the blocks at once.
    Delete {
        /// Name.
        name: String,
        /// First flatten every clone that reads from this VDI.
        #[arg(long)]
        flatten: bool,
        /// Delete even while clients have the VDI open: their reads and writes fail
        /// from then on (never zeros).
        #[arg(long)]
        force: bool,
    },
    /// Take a read-only, crash-consistent snapshot of a VDI, in O(1) (no data is
    /// copied); the VDI goes on as its copy-on-write child.
    Snapshot(crate::lineage_cmd::SnapshotArgs),
    /// Create a VDI as an O(1) copy-on-write clone of a snapshot.
    Clone(crate::lineage_cmd::CloneArgs),
    /// Throw away what a VDI wrote since one of its snapshots.
    Rollback(crate::lineage_cmd::RollbackArgs),
    /// Give a clone its own copy of the data it reads from its parents.
    Flatten(crate::lineage_cmd::FlattenArgs),
    /// Show snapshots and clones as a tree, with the space each really uses.
    Tree,
    /// Ask the node writing a VDI to flush and hand its write lock to node TO (live
    /// migration: run it when the destination takes over), and wait until it has. To
    /// a node of another zone, the VDI's home zone moves there too.
    Handover(crate::move_cmd::HandoverArgs),
    /// Make ZONE the home of a VDI whose home zone has no node up (a datacenter
    /// lost), so that a node there may write it; says first what may be missing.
    Promote(crate::move_cmd::PromoteArgs),
    /// Give a VDI or snapshot a new name (also its NBD export name). Refused while a
    /// client has it open; its data, id, snapshots and clones stay as they are.
    Rename {
        /// Current name.
        name: String,
        /// New name.
        new_name: String,
    },
    /// Grow a VDI to SIZE (shrinking is refused).
    Resize {
        /// Name.
        name: String,
        /// New size, e.g. 20G; +SIZE (e.g. +1G) adds to the current size (sent once
        /// however often the answer is lost and the CLI asks again).
        size: String,
    },
    /// Compare the replicas of every object of a VDI (digests); --repair makes
    /// differing ones identical (the VDI must not be attached for writing).
    Check(crate::heal_cmd::CheckArgs),
    /// Change how many replicas must have a VDI's writes while some are down.
    SetMinCopies(crate::heal_cmd::MinCopiesArgs),
    /// Change a VDI's write policy and zone-sync lag bounds, also while it is
    /// attached: the node writing it is handed the new record at once.
    Set(crate::policy_cmd::SetArgs),
    /// Show or set which clients may attach a VDI over NBD on TCP, by the common
    /// name of their TLS certificate (`--allow host-a,backup`; `--anyone` clears
    /// it). NBD LIST shows other clients nothing of it, and its snapshots and clones
    /// start with the same list. New connections are checked; open ones stay.
    Access(crate::access_cmd::AccessArgs),
    /// Live I/O per VDI, cluster-wide, refreshed like top: requests and bytes per
    /// second and latency quantiles of reads and writes (`--json`: one line per
    /// interval). Counted by the node each VDI is attached through.
    Iostat(crate::iostat_cmd::IostatArgs),
    /// Wait until the copies outside a zone-sync VDI's home zone have every write
    /// acknowledged so far, durably (asked of the node writing it).
    Sync(crate::sync_cmd::SyncArgs),
    /// The VDI's write lock: `drove vdi lock break NAME`.
    #[command(subcommand)]
    Lock(crate::lock_cmd::LockCmd),
    /// Copy a disk image file (raw, qcow2, ...) into a new VDI.
    Import(crate::transfer::ImportArgs),
    /// Copy a VDI into a disk image file (raw or qcow2).
    Export(crate::transfer::ExportArgs),
    /// Write what changed between two snapshots into a diff file (an incremental
    /// backup, like `rbd export-diff`); without --from, everything the snapshot holds.
    ExportDiff(crate::diff_cmd::ExportDiffArgs),
    /// Apply a diff file export-diff wrote to a VDI (a full diff creates it).
    ImportDiff(crate::diff_cmd::ImportDiffArgs),
}

pub async fn run(cmd: VdiCmd, ctx: &Ctx) -> Result<()> {
    match cmd {
        VdiCmd::Create {
            name,
            size,
            copies,
            mode,
            min_copies,
            home_zone,
            home_copies,
            policy,
        } => {
            let size = parse_size(&size)?;
            let policy = policy.parse()?;
            if let Some(c) = copies {
                if c == 0 || c > MAX_COPIES {
                    return Err(crate::fail::invalid(format!(
                        "Bad --copies {c}: use 1 to {MAX_COPIES}"
                    )));
                }
            }
            let mode: ReplicationMode = mode.parse()?;
            let d: VdiDetail = ctx
                .post(
                    "/api/vdis",
                    &CreateVdi {
                        name,
                        size,
                        copies,
                        mode,
                        min_copies,
                        home_zone,
                        home_copies,
                        write: policy,
                    },
                )
                .await?;
            show(ctx, &d)
        }
        VdiCmd::Status { name } => {
            let s: drove_daemon::api::VdiClients = ctx
                .get(&format!("/api/vdis/{}/clients", encode(&name)))
                .await?;
            if ctx.json {
                return print_json(&s);
            }
            let rows: Vec<Vec<String>> = s
                .clients
                .iter()
                .map(|c| {
                    vec![
                        c.node.to_string(),
                        c.client.clone(),
                        c.since_unix.to_string(),
                        if c.wrote { "read/write" } else { "read" }.to_string(),
                    ]
                })
                .collect();
            if rows.is_empty() {
                println!("No client has VDI '{name}' open");
            } else {
                table::print(&["NODE", "CLIENT", "SINCE (UNIX)", "ACCESS"], &rows);
            }
            for n in &s.unreachable {
                println!("node {n} did not answer: it may have clients too");
            }
            Ok(())
        }
        VdiCmd::List { filter } => {
            let all: Vec<VdiInfo> = ctx.get_consistent("/api/vdis").await?;
            // Deleted snapshots kept for the VDIs that read from them are no VDIs
            // of the user's: `vdi tree` shows them under their old names.
            let named = all.iter().filter(|v| !drove_types::is_kept(&v.name));
            let vdis: Vec<VdiInfo> = match &filter {
                Some(f) => {
                    let p = glob::Pattern::new(f)
                        .map_err(|e| crate::fail::invalid(format!("Bad --filter '{f}': {e}")))?;
                    named.filter(|v| p.matches(&v.name)).cloned().collect()
                }
                None => named.cloned().collect(),
            };
            if ctx.json {
                return print_json(&vdis);
            }
            if vdis.is_empty() {
                match &filter {
                    Some(f) => println!("No VDI matches '{f}' ({} in all)", all.len()),
                    None => println!("No VDIs yet: create one with `drove vdi create NAME SIZE`"),
                }
                return Ok(());
            }
            let name_of = |id| {
                all.iter()
                    .find(|p| p.id == id)
                    .map_or_else(|| "?".to_string(), |p| shown_name(&p.name))
            };
            let rows: Vec<Vec<String>> = vdis
                .iter()
                .map(|v| {
                    vec![
                        v.name.clone(),
                        v.id.to_string(),
                        format_size(v.size),
                        v.copies.to_string(),
                        v.mode.to_string(),
                        v.policy.to_string(),
                        kind(v).to_string(),
                        v.parent.map_or_else(|| "-".to_string(), name_of),
                    ]
                })
                .collect();
            table::print(
                &[
                    "NAME", "ID", "SIZE", "COPIES", "MODE", "POLICY", "KIND", "PARENT",
                ],
                &rows,
            );
            Ok(())
        }
        VdiCmd::Info { name } => {
            let d: VdiDetail = ctx
                .get_consistent(&format!("/api/vdis/{}", encode(&name)))
                .await?;
            // A zone-sync VDI's lag, asked of its writer once.
            let lag = match d.info.policy {
                drove_types::WritePolicy::ZoneSync => Some(crate::sync_cmd::lag(ctx, &name).await),
                drove_types::WritePolicy::Sync => None,
            };
            if ctx.json {
                // The writer's lag joins the record (null for a sync VDI, or when
                // the writer did not answer).
                let mut v = serde_json::to_value(&d)?;
                v["lag"] = serde_json::to_value(lag.and_then(Result::ok))?;
                return print_json(&v);
            }
            show(ctx, &d)?;
            if let Some(l) = lag {
                println!("lag:         {}", crate::sync_cmd::lag_line(&l));
            }
            Ok(())
        }
        VdiCmd::Delete {
            name,
            flatten,
            force,
        } => {
            let flattened = if flatten {
                crate::lineage_cmd::delete_flattening(&name, ctx).await?
            } else {
                Vec::new()
            };
            let path = format!("/api/vdis/{}?force={force}", encode(&name));
            let v: serde_json::Value = ctx.delete(&path).await?;
            let kept_for: Vec<String> = v["kept_for"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            if ctx.json {
                return print_json(&serde_json::json!({
                    "deleted": v["deleted"],
                    "flattened": flattened,
                    "not_yet_applied": v["not_yet_applied"],
                    "kept_for": kept_for,
                }));
            }
            let lagging = v["not_yet_applied"].as_array().cloned().unwrap_or_default();
            if !lagging.is_empty() {
                let ids: Vec<String> = lagging.iter().map(|n| n.to_string()).collect();
                eprintln!(
                    "warning: nodes {} had not yet applied the deletion; clients attached \
                     through them may read the old disk until they do",
                    ids.join(", ")
                );
            }
            if !flattened.is_empty() {
                println!("Flattened {}", flattened.join(", "));
            }
            if kept_for.is_empty() {
                println!("Deleted VDI '{name}'");
            } else {
                println!(
                    "Deleted snapshot '{name}': its blocks stay for {} that read from them, \
                     and are freed once nothing does (drove vdi delete {name} --flatten would \
                     have copied them into {} instead)",
                    kept_for.join(", "),
                    if kept_for.len() == 1 { "it" } else { "them" }
                );
            }
            Ok(())
        }
        VdiCmd::Snapshot(a) => crate::lineage_cmd::snapshot(a, ctx).await,
        VdiCmd::Clone(a) => crate::lineage_cmd::clone(a, ctx).await,
        VdiCmd::Rollback(a) => crate::lineage_cmd::rollback(a, ctx).await,
        VdiCmd::Flatten(a) => crate::lineage_cmd::flatten(a, ctx).await,
        VdiCmd::Tree => crate::lineage_cmd::tree(ctx).await,
        VdiCmd::Du { name } => crate::df_cmd::vdi_du(ctx, name.as_deref()).await,
        VdiCmd::Rename { name, new_name } => {
            drove_types::validate_name(&new_name)?;
            let d: VdiDetail = ctx
                .post(
                    &format!("/api/vdis/{}/rename", encode(&name)),
                    &drove_daemon::api::Rename { to: new_name },
                )
                .await?;
            if ctx.json {
                return print_json(&d);
            }
            println!("Renamed VDI '{name}' to '{}'", d.info.name);
            Ok(())
        }
        VdiCmd::Handover(a) => crate::move_cmd::handover(a, ctx).await,
        VdiCmd::Promote(a) => crate::move_cmd::promote(a, ctx).await,
        VdiCmd::Resize { name, size } => {
            let (grow, size) = match size.strip_prefix('+') {
                Some(by) => (true, parse_size(by)?),
                None => (false, parse_size(&size)?),
            };
            let d: VdiDetail = ctx
                .post(
                    &format!("/api/vdis/{}/resize", encode(&name)),
                    &Resize { size, grow },
                )
                .await?;
            show(ctx, &d)
        }
        VdiCmd::Check(a) => crate::heal_cmd::check(a, ctx).await,
        VdiCmd::SetMinCopies(a) => crate::heal_cmd::set_min_copies(a, ctx).await,
        VdiCmd::Set(a) => crate::policy_cmd::set(a, ctx).await,
        VdiCmd::Access(a) => crate::access_cmd::run(a, ctx).await,
        VdiCmd::Sync(a) => crate::sync_cmd::sync(a, ctx).await,
        VdiCmd::Iostat(a) => crate::iostat_cmd::run(a, ctx).await,
        VdiCmd::Lock(c) => crate::lock_cmd::run(c, ctx).await,
        VdiCmd::Import(a) => crate::transfer::import(a, ctx).await,
        VdiCmd::Export(a) => crate::transfer::export(a, ctx).await,
        VdiCmd::ExportDiff(a) => crate::diff_cmd::export_diff(a, ctx).await,
        VdiCmd::ImportDiff(a) => crate::diff_cmd::import_diff(a, ctx).await,
    }
}

/// VDI names are `[A-Za-z0-9._-]`, so they are path-safe; anything else is sent
/// percent-encoded and the node rejects it with a clear message.
pub fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"._-".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub(crate) fn kind(v: &VdiInfo) -> &'static str {
    if v.snapshot {
        "snapshot"
    } else if v.ephemeral {
        "ephemeral"
    } else {
        "disk"
    }
}

fn show(ctx: &Ctx, d: &VdiDetail) -> Result<()> {
    if ctx.json {
        return print_json(d);
    }
    let i = &d.info;
    println!("name:        {}", i.name);
    println!("id:          {}", i.id);
    println!("size:        {} ({} bytes)", format_size(i.size), i.size);
    println!(
        "copies:      {} (writes need {} while some are down)",
        i.copies,
        i.min_copies()
    );
    println!("mode:        {}", i.mode);
    match &i.home_zone {
        Some(z) => println!(
            "home zone:   {z} ({} copies there, fewer if it has fewer nodes up)",
            i.home_copies.unwrap_or(2).min(i.copies)
        ),
        None => println!("home zone:   none yet (the first writer's zone)"),
    }
    if let Some(p) = i.previous_home() {
        println!(
            "             moved from {} at epoch {} (drove cluster status shows the copies \
             catching up)",
            p.zone.as_deref().unwrap_or("none"),
            p.until.0
        );
    }
    println!("policy:      {}", crate::policy_cmd::describe(i));
    println!("kind:        {}", kind(i));
    if let Some(p) = i.parent {
        println!("parent id:   {p} (objects it never wrote are read from there)");
    }
    println!("object size: {}", format_size(u64::from(i.object_size)));
    println!("objects:     {}", d.objects);
    if d.nbd_tcp.is_empty() && d.nbd_unix.is_empty() {
        println!("nbd:         none on this node (a witness serves no NBD; ask a data node)");
    } else {
        println!("nbd (tcp):   {}", d.nbd_tcp);
        println!("nbd (unix):  {}", d.nbd_unix);
    }
    println!("nbd access:  {}", crate::access_cmd::describe(i));
    match &d.lock {
        Some(l) => {
            let handover = l
                .handover_to
                .map(|n| format!(", handing over to node {n}"))
                .unwrap_or_default();
            println!(
                "written by:  node {} (lock generation {}{handover})",
                l.owner, l.generation
            );
        }
        None => println!("written by:  nobody (no write lock held)"),
    }
    Ok(())
}

/// How a VDI's name is shown: a deleted snapshot kept for its readers by the name
/// it had.
pub(crate) fn shown_name(name: &str) -> String {
    match drove_types::kept_original(name) {
        Some(n) => format!("{n} (deleted)"),
        None => name.to_string(),
    }
}
