/*
 * Kiln's device server: runs the kernels of a `jit` module (kiln/runtime/jit/device_module.py) on a
 * device whose ISA differs from the host's, e.g. riscv64 under qemu-user or on a board reached
 * through a launcher command. It is compiled by the device compiler, started by the host, and
 * talks to it over its stdin/stdout with the framed protocol of kiln/runtime/jit/device_server.py
 * (docs/decisions/007-source-embedded-device.md):
 *
 *   frame   := u32 type  u64 length  payload[length]          (all integers little-endian)
 *   HELLO   (server -> host, once at start)  u32 protocol version
 *   LOAD    (host -> server)  the kernel library's bytes; reply OK or ERROR
 *   CALL    (host -> server)  u64 name_len name  u32 nargs  nargs x arg; reply OK or ERROR
 *     arg   := u32 kind  u8 dtype_code  u8 dtype_bits  u16 lanes  u32 ndim
 *              i64 shape[ndim]  u64 nbytes  (nbytes of data, inputs only)
 *              kind: 0 input tensor, 1 output tensor, 2 integer (a symbolic kernel's shape
 *              value: ndim 0, nbytes 8, the i64 value as data; passed as kTVMArgInt)
 *   OK      (server -> host)  after CALL: for each output, u64 nbytes then its bytes
 *   ERROR   (server -> host)  the error text (dlopen/dlsym failure, the kernel's message)
 *   QUIT    (host -> server)  the server exits 0
 *
 * The kernels' own stdout is redirected to stderr so that nothing but frames reach the host.
 * Any malformed frame or I/O error ends the server with status 3 (the host reports it).
 */
#include <dlfcn.h>
#include <kiln/c_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROTOCOL_VERSION 1u
enum { ARG_INPUT = 0, ARG_OUTPUT = 1, ARG_INT = 2 };
enum { MSG_HELLO = 1, MSG_LOAD = 2, MSG_CALL = 3, MSG_OK = 4, MSG_ERROR = 5, MSG_QUIT = 6 };
#define MAX_ARGS 256
#define MAX_NDIM 16
#define ALIGN 64

typedef int32_t (*packed_fn)(TVMValue*, int32_t*, int32_t, TVMValue*, int32_t*, void*);

static int in_fd = 0;
static int out_fd = 1;
static void* library = NULL;
static const char* (*library_error)(void) = NULL;

static void die(const char* what) {
  fprintf(stderr, "kiln device server: %s\n", what);
  exit(3);
}

static void read_all(void* buf, uint64_t n) {
  char* p = (char*)buf;
  while (n > 0) {
    ssize_t got = read(in_fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
    if (got <= 0) die(got == 0 ? "host closed the pipe" : "read failed");
    p += got;
    n -= (uint64_t)got;
  }
}

static void write_all(const void* buf, uint64_t n) {
  const char* p = (const char*)buf;
  while (n > 0) {
    ssize_t put = write(out_fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);
    if (put <= 0) die("write failed");
    p += put;
    n -= (uint64_t)put;
  }
}

/* Integers cross the pipe little-endian; every ISA Kiln targets (x86-64, aarch64, riscv64) is
 * little-endian, so they are copied as they are. */
static uint32_t read_u32(void) {
  uint32_t v;
  read_all(&v, sizeof v);
  return v;
}

static uint64_t read_u64(void) {
  uint64_t v;
  read_all(&v, sizeof v);
  return v;
}

static void write_header(uint32_t type, uint64_t length) {
  write_all(&type, sizeof type);
  write_all(&length, sizeof length);
}

static void reply_error(const char* prefix, const char* detail) {
  size_t a = strlen(prefix), b = detail ? strlen(detail) : 0;
  write_header(MSG_ERROR, a + b);
  write_all(prefix, a);
  if (b) write_all(detail, b);
}

static void* aligned(uint64_t nbytes) {
  void* p = NULL;
  size_t size = ((size_t)nbytes + ALIGN - 1) / ALIGN * ALIGN;
  if (posix_memalign(&p, ALIGN, size ? size : ALIGN) != 0) die("out of memory");
  return p;
}

/* LOAD: the library is written to a private temp file (the device may be another machine),
 * dlopen'ed, then unlinked (the mapping outlives the name). */
static void handle_load(uint64_t length) {
  char* bytes = (char*)aligned(length);
  read_all(bytes, length);
  const char* dir = getenv("TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/kiln-device-XXXXXX", dir && *dir ? dir : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) {
    free(bytes);
    reply_error("cannot create a temp file for the kernel library in ", path);
    return;
  }
  const char* p = bytes;
  uint64_t left = length;
  while (left > 0) {
    ssize_t put = write(fd, p, left);
    if (put <= 0) break;
    p += put;
    left -= (uint64_t)put;
  }
  close(fd);
  free(bytes);
  if (left > 0) {
    unlink(path);
    reply_error("cannot write the kernel library to ", path);
    return;
  }
  library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  unlink(path);
  if (library == NULL) {
    reply_error("dlopen of the kernel library failed: ", dlerror());
    return;
  }
  library_error = (const char* (*)(void))dlsym(library, "TVMGetLastError");
  write_header(MSG_OK, 0);
}

static void handle_call(uint64_t length) {
  (void)length; /* the fields below are self-delimiting; the host checks the total */
  uint64_t name_len = read_u64();
  if (name_len > 4096) die("function name too long");
  char name[4097];
  read_all(name, name_len);
  name[name_len] = '\0';
  uint32_t nargs = read_u32();
  if (nargs > MAX_ARGS) die("too many arguments");
  static DLTensor tensors[MAX_ARGS];
  static int64_t shapes[MAX_ARGS][MAX_NDIM];
  static uint64_t nbytes[MAX_ARGS];
  static uint32_t is_out[MAX_ARGS];
  TVMValue values[MAX_ARGS];
  int32_t codes[MAX_ARGS];
  for (uint32_t i = 0; i < nargs; ++i) {
    DLTensor* t = &tensors[i];
    memset(t, 0, sizeof *t);
    is_out[i] = read_u32();
    uint8_t dtype[4];
    read_all(dtype, 4);
    t->dtype.code = dtype[0];
    t->dtype.bits = dtype[1];
    t->dtype.lanes = (uint16_t)(dtype[2] | (dtype[3] << 8));
    uint32_t ndim = read_u32();
    if (ndim > MAX_NDIM) die("too many dimensions");
    t->ndim = (int32_t)ndim;
    read_all(shapes[i], 8u * ndim);
    t->shape = shapes[i];
    t->device.device_type = kDLCPU;
    nbytes[i] = read_u64();
    if (is_out[i] == ARG_INT) {
      if (nbytes[i] != 8) die("an integer argument has 8 bytes");
      read_all(&values[i].v_int64, 8);
      codes[i] = kTVMArgInt;
      is_out[i] = 0;
      continue;
    }
    t->data = aligned(nbytes[i]);
    if (!is_out[i]) read_all(t->data, nbytes[i]);
    values[i].v_handle = t;
    codes[i] = kTVMDLTensorHandle;
  }
  packed_fn fn = library ? (packed_fn)dlsym(library, name) : NULL;
  if (fn == NULL) {
    reply_error(library ? "no such function in the kernel library: " : "no library loaded: ",
                name);
  } else {
    TVMValue ret;
    int32_t ret_code = kTVMNullptr;
    int rc = fn(values, codes, (int32_t)nargs, &ret, &ret_code, NULL);
    if (rc != 0) {
      reply_error("", library_error ? library_error() : "the kernel failed (no message)");
    } else {
      uint64_t total = 0;
      for (uint32_t i = 0; i < nargs; ++i)
        if (is_out[i]) total += 8 + nbytes[i];
      write_header(MSG_OK, total);
      for (uint32_t i = 0; i < nargs; ++i) {
        if (!is_out[i]) continue;
        write_all(&nbytes[i], 8);
        write_all(tensors[i].data, nbytes[i]);
      }
    }
  }
  for (uint32_t i = 0; i < nargs; ++i) free(tensors[i].data);
}

int main(void) {
  /* Frames go to the original stdout; anything the kernels print goes to stderr. */
  out_fd = dup(1);
  if (out_fd < 0 || dup2(2, 1) < 0) die("cannot set up stdout");
  uint32_t version = PROTOCOL_VERSION;
  write_header(MSG_HELLO, sizeof version);
  write_all(&version, sizeof version);
  for (;;) {
    uint32_t type = read_u32();
    uint64_t length = read_u64();
    switch (type) {
      case MSG_LOAD:
        handle_load(length);
        break;
      case MSG_CALL:
        handle_call(length);
        break;
      case MSG_QUIT:
        return 0;
      default:
        die("unknown message type");
    }
  }
}
