/*
 * The jit device (type_key kiln_jit) of libkiln_runtime: kernels shipped as C source, compiled
 * on first call by $KILN_DEVICE_CC into the private cache, with the Python side's key and layout
 * (kiln/runtime/jit/device_module.py, device_toolchain.py, source_module.build_cached_library), so
 * both reuse each other's builds.
 */
#ifndef KILN_RT_JIT_H_
#define KILN_RT_JIT_H_

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  size_t fill;
} KilnSha256;

void kiln_sha256_init(KilnSha256* s);
void kiln_sha256_update(KilnSha256* s, const void* data, size_t n);
void kiln_sha256_hex(KilnSha256* s, char out[65]);

/* A NULL-terminated argument list that grows (the commands run, never through a shell). */
typedef struct {
  char** argv;
  int argc, cap;
} KilnArgs;

int kiln_args_push(KilnArgs* a, const char* word);
int kiln_args_split(KilnArgs* a, const char* words); /* split on whitespace */
void kiln_args_free(KilnArgs* a);
/* " ".join(words[from:]) into a new string */
char* kiln_args_join(const KilnArgs* a, int from);

/* A started command: kiln_spawn(argv, capture stdout?, capture stderr?) then kiln_wait (its
   exit status; the captured text in new strings). */
typedef struct {
  int pid, fd_out, fd_err;
} KilnChild;
int kiln_spawn(char* const* argv, int want_out, int want_err, KilnChild* child);
int kiln_wait(KilnChild* child, char** out, char** err);

/* Run argv (fork/execvp, no shell); stdout and stderr each into a new string when the pointers
   are given. Returns the exit status (or -1 when it could not run, with the error set). */
int kiln_run_command(char* const* argv, char** out, char** err);

/* The device toolchain (device_toolchain.py): the compiler words, compile flags, link flags. */
typedef struct {
  KilnArgs cc, flags, link_flags;
  char* ident; /* compiler_identity(cc, flags): the -### report, temp names blanked; or "" */
} KilnDeviceToolchain;

int kiln_device_toolchain(KilnDeviceToolchain* t);
void kiln_device_toolchain_free(KilnDeviceToolchain* t);
/* $KILN_CACHE_DIR/device (default ~/.cache/kiln/device), private (0700), or a fallback. */
int kiln_device_cache_dir(char* out, size_t n);

#endif /* KILN_RT_JIT_H_ */
