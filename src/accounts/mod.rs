//! Accounts (tenants) and their API keys.
//!
//! An API key is shown once, when its account is created; only its SHA-256 is stored. Keys are
//! long random strings, so a plain (unsalted) hash is enough, and it keeps authentication a single
//! indexed look-up.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use moka::sync::Cache;
use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::db::{self, schema::accounts};

/// The demo account's key, seeded in embedded mode so that `curl` works at once.
pub const DEMO_API_KEY: &str = "sk_test_demo";
const DEMO_ACCOUNT_NAME: &str = "demo";

/// Random characters after the `sk_` prefix: about 190 bits.
const KEY_RANDOM_CHARS: usize = 32;

/// An account's identity.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = accounts, check_for_backend(diesel::pg::Pg))]
pub struct Account {
    pub id: Uuid,
    pub name: String,
}

#[derive(Insertable)]
#[diesel(table_name = accounts)]
struct NewAccount<'a> {
    id: Uuid,
    name: &'a str,
    api_key_hash: Vec<u8>,
}

fn hash(api_key: &str) -> Vec<u8> {
    Sha256::digest(api_key.as_bytes()).to_vec()
}

/// How long a process answers for an API key it has seen without asking the database again. So
/// long may a key whose account is deleted (or whose hash is replaced) go on working in each
/// process that saw it; an unknown key is asked about every time, so a new one works at once.
pub const API_KEY_CACHE_TTL: Duration = Duration::from_secs(60);
/// API keys a process remembers: at 48 bytes each, well under a megabyte.
const API_KEY_CACHE_ENTRIES: u64 = 10_000;

/// The accounts of API keys seen lately, by the keys' hashes (the keys themselves are not kept).
pub struct ApiKeyCache {
    accounts: Cache<Vec<u8>, Uuid>,
}

impl Default for ApiKeyCache {
    fn default() -> Self {
        ApiKeyCache::new()
    }
}

impl ApiKeyCache {
    pub fn new() -> ApiKeyCache {
        let accounts = Cache::builder().max_capacity(API_KEY_CACHE_ENTRIES).time_to_live(API_KEY_CACHE_TTL).build();
        ApiKeyCache { accounts }
    }

    /// The id of the account an API key belongs to, if the key was seen within
    /// [`API_KEY_CACHE_TTL`]: from memory alone.
    pub fn remembered(&self, api_key: &str) -> Option<Uuid> {
        self.accounts.get(&hash(api_key))
    }

    /// The id of the account an API key belongs to, if any: from memory if the key was seen within
    /// [`API_KEY_CACHE_TTL`], else from the database (connected to only then).
    pub async fn authenticate(&self, pool: &db::Pool, api_key: &str) -> Result<Option<Uuid>, db::StoreError> {
        let hash = hash(api_key);
        if let Some(account_id) = self.accounts.get(&hash) {
            return Ok(Some(account_id));
        }
        let mut conn = db::connect(pool).await?;
        let account_id = db::query(authenticate(&mut conn, &hash)).await?;
        if let Some(account_id) = account_id {
            self.accounts.insert(hash, account_id);
        }
        Ok(account_id)
    }
}

/// The id of the account whose API key has this hash, if any.
async fn authenticate(conn: &mut AsyncPgConnection, api_key_hash: &[u8]) -> QueryResult<Option<Uuid>> {
    accounts::table
        .filter(accounts::api_key_hash.eq(api_key_hash))
        .select(accounts::id)
        .get_result(conn)
        .await
        .optional()
}

/// Creates an account with a new random API key, and returns both (the key cannot be recovered
/// later).
pub async fn create(conn: &mut AsyncPgConnection, name: &str) -> QueryResult<(Account, String)> {
    let random: String = rand::rng().sample_iter(Alphanumeric).take(KEY_RANDOM_CHARS).map(char::from).collect();
    let api_key = format!("sk_{random}");
    let new = NewAccount { id: Uuid::now_v7(), name, api_key_hash: hash(&api_key) };
    let account =
        diesel::insert_into(accounts::table).values(&new).returning(Account::as_returning()).get_result(conn).await?;
    Ok((account, api_key))
}

/// Creates the demo account (key [`DEMO_API_KEY`]) unless it exists.
pub async fn ensure_demo(conn: &mut AsyncPgConnection) -> QueryResult<()> {
    let new = NewAccount { id: Uuid::now_v7(), name: DEMO_ACCOUNT_NAME, api_key_hash: hash(DEMO_API_KEY) };
    diesel::insert_into(accounts::table)
        .values(&new)
        .on_conflict(accounts::api_key_hash)
        .do_nothing()
        .execute(conn)
        .await
        .map(drop)
}
