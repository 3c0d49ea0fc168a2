//! Finished answers kept in memory, so that most replays need no database round trip at all.
//!
//! This is safe with any number of processes because an entry only ever holds what cannot change:
//! the answer of a *finished* key, which stays in the database exactly as stored until the key
//! expires, and no entry outlives that. A key's expiry is one fact, written by the database when
//! the key finished (`expires_at`), and each entry is kept until then at most, on this process's
//! clock and early rather than late (a [`Deadline`]), whatever this process's own retention: no
//! process answers from memory what the database, or another process, already answers `410`. An
//! entry answers as the claim would: the stored answer for the same request, a mismatch (422) for
//! another, never anything for another account (the account is part of the cache key). Unfinished
//! keys are never cached, nor keys finished without a recorded expiry (before it was recorded).

use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::policy::Expiry;
use moka::sync::Cache;
use uuid::Uuid;

use super::Fingerprint;
use super::clock::Deadline;
use super::store::{Endpoint, NewKey, StoredResponse};

/// What an entry weighs besides its key and body, roughly: the fingerprint, the method and path,
/// and the cache's own bookkeeping.
const ENTRY_OVERHEAD_BYTES: usize = 160;

/// A finished key, as its claim would find it.
#[derive(Debug)]
struct Finished {
    fingerprint: Fingerprint,
    endpoint: &'static Endpoint,
    response: StoredResponse,
    /// When the key expires, at the latest.
    expires: Deadline,
}

/// Each entry is evicted when its key expires. (Eviction frees memory; what keeps an expired
/// entry from being served is [`ReplayCache::recall`]'s own check, on a clock that also counts
/// while the machine sleeps, which the cache's clock does not.)
struct UntilTheKeyExpires;

impl Expiry<(Uuid, String), Arc<Finished>> for UntilTheKeyExpires {
    fn expire_after_create(&self, _: &(Uuid, String), finished: &Arc<Finished>, _: Instant) -> Option<Duration> {
        Some(finished.expires.time_left())
    }
}

/// What the cache knows of a key, as the claim would have found it.
#[derive(Debug)]
pub enum Remembered {
    /// The key's request finished with this answer: replay it.
    Replay(StoredResponse),
    /// The key was used with another request (422).
    Mismatch,
}

/// The finished answers of this process's recent requests and replays, bounded in bytes.
pub struct ReplayCache {
    cache: Cache<(Uuid, String), Arc<Finished>>,
}

impl ReplayCache {
    /// A cache of at most about `max_bytes` of keys and answers; the least useful go first.
    pub fn new(max_bytes: u64) -> ReplayCache {
        let cache = Cache::builder()
            .max_capacity(max_bytes)
            .weigher(|(_, key): &(Uuid, String), finished: &Arc<Finished>| {
                let bytes = key.len() + finished.response.body.len() + ENTRY_OVERHEAD_BYTES;
                u32::try_from(bytes).unwrap_or(u32::MAX)
            })
            .expire_after(UntilTheKeyExpires)
            .build();
        ReplayCache { cache }
    }

    /// What the claim of `new` would find, if its key is a finished one held here: its answer
    /// for the same request, or a mismatch for another. `None`: ask the database.
    pub fn recall(&self, new: &NewKey<'_>) -> Option<Remembered> {
        let finished = self.live((new.account_id, new.key.as_str().to_owned()))?;
        let same_request = finished.fingerprint == new.fingerprint && finished.endpoint == new.endpoint;
        Some(match same_request {
            true => Remembered::Replay(finished.response.clone()),
            false => Remembered::Mismatch,
        })
    }

    /// Keeps the answer of `new`'s finished key until the key `expires`, and no longer.
    pub fn remember(&self, new: &NewKey<'_>, response: &StoredResponse, expires: Deadline) {
        if expires.has_passed() {
            return;
        }
        let finished =
            Finished { fingerprint: new.fingerprint, endpoint: new.endpoint, response: response.clone(), expires };
        self.cache.insert((new.account_id, new.key.as_str().to_owned()), Arc::new(finished));
    }

    /// Whether the key's answer is held here, and would be served (for tests and diagnostics).
    pub fn holds(&self, account_id: Uuid, key: &str) -> bool {
        self.live((account_id, key.to_owned())).is_some()
    }

    /// The entry of a key that has not expired yet; an expired one is dropped.
    fn live(&self, key: (Uuid, String)) -> Option<Arc<Finished>> {
        let finished = self.cache.get(&key)?;
        if finished.expires.has_passed() {
            self.cache.invalidate(&key);
            return None;
        }
        Some(finished)
    }

    /// The bytes the entries weigh, after pending evictions.
    pub fn weighed_bytes(&self) -> u64 {
        self.cache.run_pending_tasks();
        self.cache.weighted_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::KeyEndpoint;

    static ENDPOINT: Endpoint = Endpoint { method: "POST", path: "/v1/payments", label: KeyEndpoint::Payments };
    use crate::idempotency::IdempotencyKey;
    use crate::request_id::RequestId;

    #[test]
    fn the_cache_answers_like_the_claim_and_only_for_its_account() {
        let cache = ReplayCache::new(1 << 20);
        let key = IdempotencyKey::parse(b"order-1").unwrap();
        let (body, other_body) = (serde_json::json!({ "amount": 1 }), serde_json::json!({ "amount": 2 }));
        let (account, other_account) = (Uuid::now_v7(), Uuid::now_v7());
        let request_id = RequestId::generate();
        let new = |account_id, params| NewKey {
            account_id,
            key: &key,
            endpoint: &ENDPOINT,
            fingerprint: Fingerprint::of(params),
            params,
            request_id: &request_id,
        };
        let answer = StoredResponse { status: 201, body: b"{\"id\":1}".to_vec() };
        cache.remember(&new(account, &body), &answer, Deadline::after(Duration::from_secs(60)));

        match cache.recall(&new(account, &body)) {
            Some(Remembered::Replay(response)) => assert_eq!(response, answer),
            other => panic!("a replay, not {other:?}"),
        }
        assert!(matches!(cache.recall(&new(account, &other_body)), Some(Remembered::Mismatch)));
        assert!(cache.recall(&new(other_account, &body)).is_none(), "another account's key is its own");
    }

    #[test]
    fn a_key_that_expired_is_not_kept() {
        let cache = ReplayCache::new(1 << 20);
        let key = IdempotencyKey::parse(b"order-1").unwrap();
        let body = serde_json::json!({});
        let request_id = RequestId::generate();
        let new = NewKey {
            account_id: Uuid::nil(),
            key: &key,
            endpoint: &ENDPOINT,
            fingerprint: Fingerprint::of(&body),
            params: &body,
            request_id: &request_id,
        };
        let answer = StoredResponse { status: 201, body: b"{}".to_vec() };
        let expired = Deadline::counted_from(Duration::ZERO, Duration::from_secs(1));

        cache.remember(&new, &answer, expired);

        assert!(cache.recall(&new).is_none());
        assert!(!cache.holds(new.account_id, key.as_str()));
    }

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let max_bytes = 64 * 1024;
        let cache = ReplayCache::new(max_bytes);
        let body = serde_json::json!({});
        let answer = StoredResponse { status: 201, body: vec![b'x'; 1024] };
        let request_id = RequestId::generate();
        for n in 0..1000 {
            let key = IdempotencyKey::parse(format!("key-{n}").as_bytes()).unwrap();
            let new = NewKey {
                account_id: Uuid::nil(),
                key: &key,
                endpoint: &ENDPOINT,
                fingerprint: Fingerprint::of(&body),
                params: &body,
                request_id: &request_id,
            };
            cache.remember(&new, &answer, Deadline::after(Duration::from_secs(60)));
        }
        assert!(cache.weighed_bytes() <= max_bytes, "{} bytes", cache.weighed_bytes());
    }
}
