"""pyfelix's BPF dataplane, kernel side: programs (bpf/*.c), their maps, and tools.

Modules:
- `syscall`   the raw bpf() system call (ctypes): maps, pins, BPF_PROG_TEST_RUN.
- `maps.*`    one module per map of bpf/include/*.h: params, ctypes structs, encode/decode,
              `open_pinned()` and `dump()` (no BCC needed).
- `loader`    compiles bpf/tc.c + bpf/xdp.c ONCE with BCC, adopting pinned maps.
- `testrun`   runs loaded programs on crafted packets (`packets` builds them).
- `compiler`  pure Python: proto messages -> desired map contents (no kernel).
- `conntrack` the conntrack cleaner.

Only `loader` imports bcc, and only when called.
"""
