//! Tests of the protocol end to end: an exporter and importers over real sockets, hostile
//! peers, lifetimes against a model, and real processes.

mod exchange;
