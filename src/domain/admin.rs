//! Run-time control of domains through `async_domain`: list, set, release, pause, resume.
