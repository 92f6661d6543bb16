//! ramgrid's wire codecs as pure functions over byte slices: the memcached text and meta protocols
//! ([`memcache`]) and, later, the native batch frames. No I/O happens here.

#![warn(missing_docs)]

pub mod cluster;
pub mod memcache;
pub mod native;
pub mod shm;
