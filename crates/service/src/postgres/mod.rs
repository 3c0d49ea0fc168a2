//! The PostgreSQL servers this binary starts and owns: a private cluster ([`cluster`]), the one
//! embedded mode keeps under `PAYMENTS_DATA_DIR` ([`embedded`]), and a local Citus cluster of a
//! coordinator and workers ([`citus`]), for `serve --citus-workers N`, the lab and the tests.
//!
//! What runs against a database, whoever started it, is [`crate::db`]'s: the pool, the
//! statements, the migrations and the spreading of the schema over Citus. This module uses those
//! to make the database it starts ready; nothing there, and nothing on the request path, uses this.

pub mod citus;
pub mod cluster;
pub mod embedded;
