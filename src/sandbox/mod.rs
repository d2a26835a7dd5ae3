pub mod seccomp;
