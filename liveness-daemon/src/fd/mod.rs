//! Descriptor plumbing: descriptors clients pass with request lines ([`pass`]) and the
//! daemon's own registered with the runtime's epoll ([`registered`]).

pub mod pass;
pub mod registered;
