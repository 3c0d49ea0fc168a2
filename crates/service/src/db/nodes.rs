//! On Citus, the node that holds an account's shards, reached without the coordinator: a
//! statement delegated to the account's shard (see [`super::delegate`]) is sent on a connection of
//! the service's own to that node, where the call runs at once, instead of to the coordinator,
//! which would only pass it on. The coordinator then serves only the rest (look-ups, a key's
//! release, the workers' scans, and where each account's shards are), and adding workers adds
//! capacity for the claims and phases.
//!
//! Which node holds an account's shards is asked of the coordinator's catalog the first time, and
//! again once the answer is [`PLACEMENT_AGE`] old. A call sent to a node the shards have just left
//! still lands: Citus passes it on from any node whose metadata is synced, as the coordinator
//! would. A node no connection to which could be had in time is left alone for
//! [`UNREACHABLE_FOR`], its calls sent through the coordinator meanwhile: nothing was sent to it,
//! so nothing runs twice.
//!
//! A node's address that changes (`citus_update_node`, a failover) is followed within
//! [`PLACEMENT_AGE`]: meanwhile the calls go to the old address, so an old primary must be fenced,
//! as a failover requires of every client. Each process keeps a pool per node, as large as its
//! pool to the coordinator: the nodes' `max_connections` must allow for it, or
//! `PAYMENTS_CITUS_STRAIGHT_TO_WORKERS=false` sends every call through the coordinator.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use quick_cache::sync::Cache;
use uuid::Uuid;

use super::{Pool, pool_to};
use crate::runtime::ProcessRuntime;

/// How long a node's placement of an account's shards is trusted before it is asked again. A
/// shard moved meanwhile costs its calls one hop more, never a wrong answer.
pub const PLACEMENT_AGE: Duration = Duration::from_secs(30);

/// How long a node no connection to which could be had in time is passed over.
pub const UNREACHABLE_FOR: Duration = Duration::from_secs(10);

/// The accounts whose placement is kept: the least used are asked again.
const ACCOUNTS_KEPT: usize = 100_000;

/// Where an account's (`$2`) shards are, as the coordinator's catalog says: the host and port of
/// the node that holds its shard of `$1` (and so of every table colocated with it), if that is a
/// worker whose metadata is synced, where the call can run. No row: its calls go through the
/// coordinator.
pub const PLACEMENT_SQL: &str = "
SELECT n.nodename, n.nodeport
FROM pg_dist_placement p JOIN pg_dist_node n ON n.groupid = p.groupid
WHERE p.shardid = get_shard_id_for_distribution_column($1::text::regclass, $2::text::uuid)
  AND n.groupid <> 0 AND n.noderole = 'primary' AND n.isactive AND n.hasmetadata AND n.metadatasynced
LIMIT 1";

/// A node, by the address the coordinator's catalog gives it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    pub host: String,
    pub port: u16,
}

/// An account's node as last looked up (none: its calls go through the coordinator).
#[derive(Clone)]
struct Placement {
    node: Option<Node>,
    looked_up: Instant,
}

/// The nodes' pools, and where each account's shards are.
pub struct Nodes {
    /// The database's connection settings, whose host and port each node's pool replaces.
    settings: tokio_postgres::Config,
    pool_size: u32,
    /// The process's runtime, on which every node's connections are opened and driven.
    runtime: ProcessRuntime,
    pools: Mutex<HashMap<Node, NodePool>>,
    placements: Cache<Uuid, Placement>,
}

struct NodePool {
    pool: Pool,
    /// Set when no connection to the node could be had in time: until then, it is passed over.
    unreachable_until: Option<Instant>,
}

impl Nodes {
    /// The nodes of the database `database_url` names, each with a pool of `pool_size` driven on
    /// `runtime`; none if the URL does not parse (its calls then go through the coordinator,
    /// which says what is wrong).
    pub fn new(database_url: &str, pool_size: u32, runtime: ProcessRuntime) -> Option<Nodes> {
        let settings = database_url.parse::<tokio_postgres::Config>().ok()?;
        let (pools, placements) = (Mutex::new(HashMap::new()), Cache::new(ACCOUNTS_KEPT));
        Some(Nodes { settings, pool_size, runtime, pools, placements })
    }

    /// The node of `account_id`'s shards if it is known and recent: `Some(None)` when its calls go
    /// through the coordinator, none when it must be looked up ([`Nodes::placed`]).
    pub fn known(&self, account_id: Uuid) -> Option<Option<Node>> {
        let placement = self.placements.get(&account_id)?;
        (placement.looked_up.elapsed() < PLACEMENT_AGE).then_some(placement.node)
    }

    /// Records where `account_id`'s shards are, as just looked up with [`PLACEMENT_SQL`].
    pub fn placed(&self, account_id: Uuid, node: Option<Node>) {
        self.placements.insert(account_id, Placement { node, looked_up: Instant::now() });
    }

    /// The pool of `node`, made the first time; none while it is passed over as unreachable.
    pub fn pool(&self, node: &Node) -> Option<Pool> {
        let mut pools = self.pools.lock().expect("never held across a panic");
        let entry = pools.entry(node.clone()).or_insert_with(|| NodePool {
            pool: pool_to(with_address(&self.settings, node), self.pool_size, self.runtime.clone()),
            unreachable_until: None,
        });
        match entry.unreachable_until {
            Some(until) if Instant::now() < until => None,
            _ => Some(entry.pool.clone()),
        }
    }

    /// Passes over `node` for [`UNREACHABLE_FOR`]: a connection to it could not be had.
    pub fn unreachable(&self, node: &Node) {
        if let Some(entry) = self.pools.lock().expect("never held across a panic").get_mut(node) {
            entry.unreachable_until = Some(Instant::now() + UNREACHABLE_FOR);
        }
    }
}

/// `settings` with `node`'s address as its only host and port (a config's hosts are a list, one
/// more per `host`, so it is made anew); the rest (user, password, database, timeout) as they were.
fn with_address(settings: &tokio_postgres::Config, node: &Node) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config.host(&node.host).port(node.port);
    if let Some(user) = settings.get_user() {
        config.user(user);
    }
    if let Some(password) = settings.get_password() {
        config.password(password);
    }
    if let Some(dbname) = settings.get_dbname() {
        config.dbname(dbname);
    }
    if let Some(options) = settings.get_options() {
        config.options(options);
    }
    if let Some(timeout) = settings.get_connect_timeout() {
        config.connect_timeout(*timeout);
    }
    config.ssl_mode(settings.get_ssl_mode());
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_settings_are_the_databases_at_the_nodes_address() {
        let settings: tokio_postgres::Config =
            "postgres://app:secret@coordinator:5432/payments?connect_timeout=3".parse().unwrap();
        let node = Node { host: "worker-1".into(), port: 6432 };
        let config = with_address(&settings, &node);
        assert_eq!(config.get_hosts(), &[tokio_postgres::config::Host::Tcp("worker-1".into())]);
        assert_eq!(config.get_ports(), &[6432]);
        assert_eq!(config.get_user(), Some("app"));
        assert_eq!(config.get_password(), Some(&b"secret"[..]));
        assert_eq!(config.get_dbname(), Some("payments"));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(3)));
    }

    #[tokio::test]
    async fn a_node_that_could_not_be_reached_is_passed_over_for_a_while() {
        let nodes = Nodes::new("postgres://app@coordinator/payments", 1, ProcessRuntime::current()).unwrap();
        let node = Node { host: "worker-1".into(), port: 5432 };
        assert!(nodes.pool(&node).is_some());
        nodes.unreachable(&node);
        assert!(nodes.pool(&node).is_none(), "passed over");
        nodes.pools.lock().unwrap().get_mut(&node).unwrap().unreachable_until = Some(Instant::now());
        assert!(nodes.pool(&node).is_some(), "tried again once the while is over");
    }

    #[test]
    fn a_placement_is_trusted_until_it_is_old() {
        let nodes = Nodes::new("postgres://app@coordinator/payments", 1, ProcessRuntime::current()).unwrap();
        let account = Uuid::new_v4();
        assert_eq!(nodes.known(account), None);
        let node = Node { host: "worker-1".into(), port: 5432 };
        nodes.placed(account, Some(node.clone()));
        assert_eq!(nodes.known(account), Some(Some(node)));
        nodes.placements.insert(account, Placement { node: None, looked_up: Instant::now() - PLACEMENT_AGE });
        assert_eq!(nodes.known(account), None);
    }
}
