//! Accounts (tenants) and their API keys.
//!
//! An API key is shown once, when its account is created; only its SHA-256 is stored. Keys are
//! long random strings, so a plain (unsalted) hash is enough, and it keeps authentication a single
//! indexed look-up.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use quick_cache::sync::Cache;
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

fn hash(api_key: &str) -> [u8; 32] {
    Sha256::digest(api_key.as_bytes()).into()
}

/// How long a process answers for an API key it has seen without asking the database again. So
/// long may a key whose account is deleted (or whose hash is replaced) go on working in each
/// process that saw it; an unknown key is asked about every time, so a new one works at once.
pub const API_KEY_CACHE_TTL: Duration = Duration::from_secs(60);
/// API keys a process remembers: at about 64 bytes each, well under a megabyte.
const API_KEY_CACHE_ENTRIES: usize = 10_000;

/// The accounts of API keys seen lately, by the keys' hashes (the keys themselves are not kept),
/// each with the instant it is to be asked about again. `quick_cache` for the reason given at
/// [`crate::idempotency::ReplayCache`]: every authenticated request looks its key up here.
pub struct ApiKeyCache {
    accounts: Cache<[u8; 32], (Uuid, Instant)>,
}

impl Default for ApiKeyCache {
    fn default() -> Self {
        ApiKeyCache::new()
    }
}

impl ApiKeyCache {
    pub fn new() -> ApiKeyCache {
        ApiKeyCache { accounts: Cache::new(API_KEY_CACHE_ENTRIES) }
    }

    /// The id of the account an API key belongs to, if the key was seen within
    /// [`API_KEY_CACHE_TTL`]: from memory alone. If not, the key as [`ApiKeyCache::authenticate`]
    /// asks the database about it (by its hash, worked out once).
    pub fn remembered(&self, api_key: &str) -> Result<Uuid, Unremembered> {
        let hash = hash(api_key);
        self.recall(&hash, Instant::now()).ok_or(Unremembered(hash))
    }

    /// The account of a key's hash, if it is remembered and not yet to be asked about again at
    /// `now`.
    fn recall(&self, hash: &[u8; 32], now: Instant) -> Option<Uuid> {
        let (account_id, ask_again_at) = self.accounts.get(hash)?;
        (now < ask_again_at).then_some(account_id)
    }

    /// The id of the account an API key this process does not remember belongs to, if any, from
    /// the database (connected to only now); remembered for [`API_KEY_CACHE_TTL`] from then on. A
    /// key the database no longer knows is forgotten here too (see [`ApiKeyCache::forget`]).
    pub async fn authenticate(&self, pool: &db::Pool, key: Unremembered) -> Result<Option<Uuid>, db::StoreError> {
        let Unremembered(hash) = key;
        let asked = Instant::now();
        let mut conn = db::connect(pool).await?;
        let account_id = db::query(authenticate(&mut conn, &hash)).await?;
        match account_id {
            Some(account_id) => self.remember(hash, account_id, asked),
            None => self.forget(&hash, asked),
        }
        Ok(account_id)
    }

    /// Remembers the account of a key's hash, found in the database by a look-up sent at `asked`:
    /// its minute is counted from then (an entry is never younger than the database's answer).
    fn remember(&self, hash: [u8; 32], account_id: Uuid, asked: Instant) {
        self.accounts.insert(hash, (account_id, asked + API_KEY_CACHE_TTL));
    }

    /// Forgets a key's hash the database, asked at `asked`, did not know: unless a concurrent
    /// request asked later and found it (a key created in between), whose newer answer stands.
    fn forget(&self, hash: &[u8; 32], asked: Instant) {
        self.accounts.remove_if(hash, |&(_, ask_again_at)| ask_again_at <= asked + API_KEY_CACHE_TTL);
    }
}

/// An API key this process does not remember (or no longer may answer for), by its hash.
pub struct Unremembered([u8; 32]);

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
    let new = NewAccount { id: Uuid::now_v7(), name, api_key_hash: hash(&api_key).to_vec() };
    let insert = diesel::insert_into(accounts::table).values(&new).returning(Account::as_returning());
    let account = db::first_row(insert.load(conn)).await?.ok_or(diesel::result::Error::NotFound)?;
    Ok((account, api_key))
}

/// Creates the demo account (key [`DEMO_API_KEY`]) unless it exists.
pub async fn ensure_demo(conn: &mut AsyncPgConnection) -> QueryResult<()> {
    let new = NewAccount { id: Uuid::now_v7(), name: DEMO_ACCOUNT_NAME, api_key_hash: hash(DEMO_API_KEY).to_vec() };
    diesel::insert_into(accounts::table)
        .values(&new)
        .on_conflict(accounts::api_key_hash)
        .do_nothing()
        .execute(conn)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_key_is_asked_about_again_once_its_time_is_up() {
        let cache = ApiKeyCache::new();
        let (key, account_id, asked) = (hash("sk_test_remembered"), Uuid::now_v7(), Instant::now());
        cache.remember(key, account_id, asked);

        assert_eq!(cache.recall(&key, asked + API_KEY_CACHE_TTL - Duration::from_millis(1)), Some(account_id));
        assert_eq!(cache.recall(&key, asked + API_KEY_CACHE_TTL), None);
        assert_eq!(cache.recall(&hash("sk_test_other"), asked), None, "another key is not this one");
    }

    #[test]
    fn an_unknown_key_is_forgotten_unless_a_later_answer_found_it() {
        let cache = ApiKeyCache::new();
        let (key, account_id, earlier) = (hash("sk_test_created_meanwhile"), Uuid::now_v7(), Instant::now());
        let later = earlier + Duration::from_millis(5);
        cache.remember(key, account_id, later);

        cache.forget(&key, earlier);
        assert_eq!(cache.recall(&key, later), Some(account_id), "an older 'unknown' does not undo a newer answer");

        cache.forget(&key, later);
        assert_eq!(cache.recall(&key, later), None, "an answer as new as the entry's forgets it");
    }
}
