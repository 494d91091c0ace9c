/*
 * The jit device module (type_key kiln_jit) natively: the Python side's
 * kiln/runtime/jit/device_module.py without Python. Bytes (stream encoding):
 *
 *     u64 version (1) | vec<string> sources | u64 n | n x (string name | vec<string> arg_dtypes |
 *                                                         u64 num_outputs)
 *
 * On the first call of any of its functions the sources are compiled with the device toolchain
 * (rt_jit_toolchain.c) and linked -shared with the backend support into
 * $KILN_CACHE_DIR/device/device-<key>.so, the key being source_module.build_cached_library's:
 * sha256 of each source, the backend source, the compiler words, its identity report, the flags
 * and link flags + -lm, and the (empty) link options, each followed by a NUL byte; first 32 hex
 * digits. Built in a temp folder, linked to a temp name in the cache folder and renamed into
 * place, so the Python runtime and other processes reuse it (a hit refreshes its mtime; the
 * Python side's size cap, kiln/runtime/toolchain/cache_limit.py, evicts the least recently used; this
 * runtime does not trim). A compiler failure is an error
 * carrying the compiler's stderr (TVMGetLastError). Kernels run in this process (no device
 * server: on the device, the compiler is the device's own or a cross compiler it can run).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_internal.h"
#include "rt_jit.h"

extern const char kiln_embedded_backend_c[], kiln_embedded_backend_c_end[];
extern const char kiln_embedded_api_h[], kiln_embedded_api_h_end[];

typedef struct {
  KilnModule base;
  char** sources;
  size_t* source_len;
  size_t num_sources;
  char** names;
  size_t num_funcs;
  pthread_mutex_t lock;
  void* handle;
  const char* (*lib_error)(void);
} KilnJit;

typedef struct {
  KilnJit* jit;
  char* name;
  TVMBackendPackedCFunc fn;
} KilnJitStub;

static int kiln_write_file(const char* path, const char* data, size_t n) {
  FILE* f = fopen(path, "wb");
  int ok = f != NULL && fwrite(data, 1, n, f) == n;
  if (f && fclose(f) != 0) ok = 0;
  return ok ? 0 : kiln_fail("kiln_jit: cannot write %s", path);
}

/* cc flags -I<work>/include -c src -o src.o for every source, up to one compiler per CPU at a
   time (as the Python side's compile_objects); the first failure's stderr in the error. */
static int kiln_jit_compile_all(const KilnDeviceToolchain* t, const char* work,
                                const KilnArgs* srcs, KilnArgs* objs) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int jobs = cpus > 0 ? (int)cpus : 1, next = 0, running = 0, failed = 0, i, k;
  KilnChild* child = (KilnChild*)kiln_calloc((size_t)srcs->argc + 1, sizeof(KilnChild));
  KilnArgs* cmd = (KilnArgs*)kiln_calloc((size_t)srcs->argc + 1, sizeof(KilnArgs));
  char inc[4200], obj[4300];
  if (child == NULL || cmd == NULL) {
    free(child);
    free(cmd);
    return -1;
  }
  snprintf(inc, sizeof(inc), "-I%s/include", work);
  for (k = 0; k < srcs->argc; ++k) {
    snprintf(obj, sizeof(obj), "%s.o", srcs->argv[k]);
    for (i = 0; i < t->cc.argc; ++i) kiln_args_push(&cmd[k], t->cc.argv[i]);
    for (i = 0; i < t->flags.argc; ++i) kiln_args_push(&cmd[k], t->flags.argv[i]);
    kiln_args_push(&cmd[k], inc);
    kiln_args_push(&cmd[k], "-c");
    kiln_args_push(&cmd[k], srcs->argv[k]);
    kiln_args_push(&cmd[k], "-o");
    kiln_args_push(&cmd[k], obj);
    kiln_args_push(objs, obj);
  }
  /* start in order, wait in order: at most `jobs` compilers run at once */
  for (k = 0; k < srcs->argc; ++k) {
    while (!failed && next < srcs->argc && running < jobs) {
      if (kiln_spawn(cmd[next].argv, 0, 1, &child[next]) != 0) {
        failed = 1;
        break;
      }
      ++next;
      ++running;
    }
    if (k >= next) break;
    {
      char* err = NULL;
      int rc = kiln_wait(&child[k], NULL, &err);
      --running;
      if (rc != 0 && !failed) {
        char* line = kiln_args_join(&cmd[k], 0);
        kiln_fail("kiln_jit: the device compiler failed (exit %d): %s\n%s", rc,
                  line ? line : "", err ? err : "");
        free(line);
        failed = 1;
      }
      free(err);
    }
  }
  for (; k < next; ++k) kiln_wait(&child[k], NULL, NULL); /* after a failure: reap the rest */
  for (k = 0; k < srcs->argc; ++k) kiln_args_free(&cmd[k]);
  free(cmd);
  free(child);
  return failed ? -1 : 0;
}

static int kiln_jit_link(const KilnDeviceToolchain* t, const KilnArgs* objs, const char* target) {
  KilnArgs a = {0};
  char tmp[4200], *err = NULL, *cmd;
  const char* slash = strrchr(target, '/');
  int i, rc, fd;
  snprintf(tmp, sizeof(tmp), "%.*s/.%s.XXXXXX.tmp", (int)(slash - target), target, slash + 1);
  if ((fd = mkstemps(tmp, 4)) < 0) return kiln_fail("kiln_jit: cannot create %s", tmp);
  close(fd);
  for (i = 0; i < t->cc.argc; ++i) kiln_args_push(&a, t->cc.argv[i]);
  for (i = 0; i < t->link_flags.argc; ++i) kiln_args_push(&a, t->link_flags.argv[i]);
  kiln_args_push(&a, "-o");
  kiln_args_push(&a, tmp);
  for (i = 0; i < objs->argc; ++i) kiln_args_push(&a, objs->argv[i]);
  kiln_args_push(&a, "-lm");
  rc = kiln_run_command(a.argv, NULL, &err);
  if (rc != 0) {
    cmd = kiln_args_join(&a, 0);
    kiln_fail("kiln_jit: linking the device library failed (exit %d): %s\n%s", rc,
              cmd ? cmd : "", err ? err : "");
    free(cmd);
    unlink(tmp);
  } else if (rename(tmp, target) != 0) {
    rc = kiln_fail("kiln_jit: cannot rename %s to %s", tmp, target);
    unlink(tmp);
  }
  free(err);
  kiln_args_free(&a);
  return rc ? -1 : 0;
}

static void kiln_hash_part(KilnSha256* h, const char* data, size_t n) {
  kiln_sha256_update(h, data, n);
  kiln_sha256_update(h, "", 1);
}

/* The cached library's path (building it on a miss). */
static int kiln_jit_build(KilnJit* jit, char* target, size_t target_n) {
  KilnDeviceToolchain t;
  KilnSha256 h;
  KilnArgs all = {0}, objs = {0}, srcs = {0};
  char dir[4096], hex[65], work[] = "/tmp/kiln-jit-XXXXXX", path[4200], *cc_words, *flag_words;
  size_t i, backend_n = (size_t)(kiln_embedded_backend_c_end - kiln_embedded_backend_c);
  int rc = -1;
  if (kiln_device_toolchain(&t) != 0) {
    kiln_device_toolchain_free(&t);
    return -1;
  }
  if (kiln_device_cache_dir(dir, sizeof(dir)) != 0) goto done;
  kiln_sha256_init(&h);
  for (i = 0; i < jit->num_sources; ++i) kiln_hash_part(&h, jit->sources[i], jit->source_len[i]);
  kiln_hash_part(&h, kiln_embedded_backend_c, backend_n);
  cc_words = kiln_args_join(&t.cc, 0);
  for (i = 0; i < (size_t)t.flags.argc; ++i) kiln_args_push(&all, t.flags.argv[i]);
  for (i = 0; i < (size_t)t.link_flags.argc; ++i) kiln_args_push(&all, t.link_flags.argv[i]);
  kiln_args_push(&all, "-lm");
  flag_words = kiln_args_join(&all, 0);
  kiln_args_free(&all);
  if (cc_words == NULL || flag_words == NULL) {
    free(cc_words);
    free(flag_words);
    goto done;
  }
  kiln_hash_part(&h, cc_words, strlen(cc_words));
  kiln_hash_part(&h, t.ident, strlen(t.ident));
  kiln_hash_part(&h, flag_words, strlen(flag_words));
  kiln_hash_part(&h, "", 0); /* link options */
  free(cc_words);
  free(flag_words);
  kiln_sha256_hex(&h, hex);
  snprintf(target, target_n, "%s/device-%.32s.so", dir, hex);
  if (access(target, F_OK) == 0) {
    /* a hit: refresh the mtime, which orders the cache's LRU eviction (cache_limit.py) */
    utimensat(AT_FDCWD, target, NULL, 0);
    rc = 0;
    goto done;
  }
  if (mkdtemp(work) == NULL) {
    kiln_fail("kiln_jit: cannot create a temp folder");
    goto done;
  }
  snprintf(path, sizeof(path), "%s/include", work);
  mkdir(path, 0700);
  snprintf(path, sizeof(path), "%s/include/kiln", work);
  mkdir(path, 0700);
  snprintf(path, sizeof(path), "%s/include/kiln/c_runtime_api.h", work);
  if (kiln_write_file(path, kiln_embedded_api_h,
                      (size_t)(kiln_embedded_api_h_end - kiln_embedded_api_h)) != 0)
    goto clean;
  for (i = 0; i <= jit->num_sources; ++i) {
    int last = i == jit->num_sources;
    if (last) snprintf(path, sizeof(path), "%s/backend.c", work);
    else snprintf(path, sizeof(path), "%s/device%zu.c", work, i);
    if (kiln_write_file(path, last ? kiln_embedded_backend_c : jit->sources[i],
                        last ? backend_n : jit->source_len[i]) != 0 ||
        kiln_args_push(&srcs, path) != 0)
      goto clean;
  }
  if (kiln_jit_compile_all(&t, work, &srcs, &objs) == 0) rc = kiln_jit_link(&t, &objs, target);
clean:
  for (i = 0; i < (size_t)objs.argc; ++i) unlink(objs.argv[i]);
  for (i = 0; i <= jit->num_sources; ++i) {
    if (i == jit->num_sources) snprintf(path, sizeof(path), "%s/backend.c", work);
    else snprintf(path, sizeof(path), "%s/device%zu.c", work, i);
    unlink(path);
  }
  snprintf(path, sizeof(path), "%s/include/kiln/c_runtime_api.h", work);
  unlink(path);
  snprintf(path, sizeof(path), "%s/include/kiln", work);
  rmdir(path);
  snprintf(path, sizeof(path), "%s/include", work);
  rmdir(path);
  rmdir(work);
done:
  kiln_args_free(&objs);
  kiln_args_free(&srcs);
  kiln_device_toolchain_free(&t);
  return rc;
}

/* First call: build (or find) and open the library; then the kernel's own symbol. */
static int kiln_jit_resolve(KilnJitStub* s) {
  KilnJit* jit = s->jit;
  int rc = 0;
  pthread_mutex_lock(&jit->lock);
  if (jit->handle == NULL) {
    char target[4400];
    if ((rc = kiln_jit_build(jit, target, sizeof(target))) == 0) {
      jit->handle = dlopen(target, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (jit->handle == NULL) rc = kiln_fail("kiln_jit: cannot dlopen %s: %s", target, dlerror());
      else *(void**)&jit->lib_error = dlsym(jit->handle, "TVMGetLastError");
    }
  }
  if (rc == 0 && s->fn == NULL) {
    *(void**)&s->fn = dlsym(jit->handle, s->name);
    if (s->fn == NULL) rc = kiln_fail("kiln_jit: %s is not in the compiled library", s->name);
  }
  pthread_mutex_unlock(&jit->lock);
  return rc;
}

static int kiln_jit_call(TVMValue* args, int* codes, int n, TVMValue* ret, int* ret_code,
                         void* resource) {
  KilnJitStub* s = (KilnJitStub*)resource;
  if (s->fn == NULL && kiln_jit_resolve(s) != 0) return -1;
  if (s->fn(args, codes, n, ret, ret_code, NULL) != 0) {
    kiln_take_lib_error(s->jit->lib_error, s->name);
    return -1;
  }
  return 0;
}

static void kiln_jit_free_stub(void* resource) {
  KilnJitStub* s = (KilnJitStub*)resource;
  free(s->name);
  free(s);
}

static int kiln_jit_get_own(KilnModule* self, const char* name, KilnFunc** out) {
  KilnJit* jit = (KilnJit*)self;
  KilnJitStub* s;
  size_t i;
  *out = NULL;
  for (i = 0; i < jit->num_funcs && strcmp(jit->names[i], name) != 0; ++i) {
  }
  if (i == jit->num_funcs) return 0;
  if ((s = (KilnJitStub*)kiln_calloc(1, sizeof(*s))) == NULL) return -1;
  s->jit = jit;
  if ((s->name = kiln_strndup(name, strlen(name))) == NULL ||
      (*out = kiln_func_method(self, NULL, NULL)) == NULL) {
    kiln_jit_free_stub(s);
    return -1;
  }
  (*out)->cfunc = kiln_jit_call;
  (*out)->resource = s;
  (*out)->fin = kiln_jit_free_stub;
  (*out)->name = s->name;
  return 0;
}

static void kiln_jit_destroy(KilnModule* self) {
  KilnJit* jit = (KilnJit*)self;
  size_t i;
  for (i = 0; jit->sources && i < jit->num_sources; ++i) free(jit->sources[i]);
  for (i = 0; jit->names && i < jit->num_funcs; ++i) free(jit->names[i]);
  free(jit->sources);
  free(jit->source_len);
  free(jit->names);
  pthread_mutex_destroy(&jit->lock);
}

int kiln_load_jit(const uint8_t* data, size_t n, KilnModule** out) {
  KilnStream s = {data, n, "kiln_jit module"};
  KilnJit* jit = (KilnJit*)kiln_module_new(sizeof(KilnJit), "kiln_jit");
  uint64_t version, count, i, ndt, nout;
  const uint8_t* p;
  size_t len;
  *out = NULL;
  if (jit == NULL) return -1;
  pthread_mutex_init(&jit->lock, NULL);
  jit->base.get_own = kiln_jit_get_own;
  jit->base.destroy = kiln_jit_destroy;
  if (kiln_read_u64(&s, &version, "version") != 0) goto fail;
  if (version != 1) {
    kiln_fail("%s: format version %llu; this runtime reads 1", s.what,
              (unsigned long long)version);
    goto fail;
  }
  if (kiln_read_count(&s, 8, &count, "sources") != 0 ||
      (jit->sources = (char**)kiln_calloc((size_t)count + 1, sizeof(char*))) == NULL ||
      (jit->source_len = (size_t*)kiln_calloc((size_t)count + 1, sizeof(size_t))) == NULL)
    goto fail;
  for (i = 0; i < count; ++i) {
    if (kiln_read_bytes(&s, &p, &len, "source") != 0 ||
        (jit->sources[i] = kiln_strndup((const char*)p, len)) == NULL)
      goto fail;
    jit->source_len[i] = len;
    jit->num_sources = (size_t)i + 1;
  }
  if (kiln_read_count(&s, 24, &count, "functions") != 0 ||
      (jit->names = (char**)kiln_calloc((size_t)count + 1, sizeof(char*))) == NULL)
    goto fail;
  for (i = 0; i < count; ++i) {
    uint64_t k;
    if (kiln_read_bytes(&s, &p, &len, "name") != 0 || memchr(p, 0, len) != NULL ||
        (jit->names[i] = kiln_strndup((const char*)p, len)) == NULL) {
      if (TVMGetLastError()[0] == '\0') kiln_fail("%s: corrupt function name", s.what);
      goto fail;
    }
    jit->num_funcs = (size_t)i + 1;
    if (kiln_read_count(&s, 8, &ndt, "arg_dtypes") != 0) goto fail;
    for (k = 0; k < ndt; ++k)
      if (kiln_read_bytes(&s, &p, &len, "arg_dtype") != 0) goto fail;
    if (kiln_read_u64(&s, &nout, "num_outputs") != 0) goto fail;
    if (nout > ndt) {
      kiln_fail("%s: %s: %llu outputs of %llu arguments", s.what, jit->names[i],
                (unsigned long long)nout, (unsigned long long)ndt);
      goto fail;
    }
  }
  if (s.left) {
    kiln_fail("%s: %zu unexpected trailing bytes", s.what, s.left);
    goto fail;
  }
  *out = &jit->base;
  return 0;
fail:
  kiln_module_release(&jit->base);
  return -1;
}
