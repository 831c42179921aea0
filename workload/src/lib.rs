//! Usage events shaped like the reference tenants' traffic.
