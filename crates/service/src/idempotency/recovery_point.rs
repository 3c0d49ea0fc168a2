//! How far a request has got.

use diesel::pg::Pg;
use diesel::serialize::{Output, ToSql};
use diesel::sql_types::Text;

/// The last phase a request committed, stored on its key row. A request always resumes here.
///
/// Every key begins at [`RecoveryPoint::STARTED`] and ends at [`RecoveryPoint::FINISHED`]; in
/// between, each endpoint has points of its own, which it declares with its
/// [`Endpoint`](super::Endpoint) (a payment's `charge_created`, a refund's `refund_created`). A
/// point is a name: the layer knows only the two ends, and reads a key's point back through its
/// endpoint ([`Endpoint::point`](super::Endpoint::point)), so that a new endpoint adds points
/// without touching the layer.
///
/// `started`: the key is claimed; what its request makes may exist (a pending payment). Nothing is
/// known about the foreign call, so resuming makes it again with the same downstream key, which
/// cannot act twice. `finished`: the response is stored; every later request with the key replays
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, diesel::expression::AsExpression)]
#[diesel(sql_type = Text)]
pub struct RecoveryPoint(&'static str);

impl RecoveryPoint {
    pub const STARTED: RecoveryPoint = RecoveryPoint("started");
    pub const FINISHED: RecoveryPoint = RecoveryPoint("finished");

    /// An endpoint's own point, by the name stored on the key row: lower case, words joined by
    /// `_`, at most 40 characters (what the database's `recovery_point` domain admits).
    pub const fn new(name: &'static str) -> RecoveryPoint {
        RecoveryPoint(name)
    }

    /// The point as stored on the key row and shown in a key's story.
    pub const fn as_str(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Display for RecoveryPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl serde::Serialize for RecoveryPoint {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl ToSql<Text, Pg> for RecoveryPoint {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> diesel::serialize::Result {
        <str as ToSql<Text, Pg>>::to_sql(self.0, out)
    }
}
