//! An exporter and importers in one process, over real sockets.
