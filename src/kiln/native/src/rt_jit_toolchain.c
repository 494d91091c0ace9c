/*
 * The jit device's toolchain in C, the twin of kiln/runtime/jit/device_toolchain.py and
 * toolchain.compiler_identity (same flags, same probes, same report text, so the cache key is
 * the same): the compiler ($KILN_DEVICE_CC, else $CC, else cc/gcc/clang on PATH), the flags
 * (-O3 -fPIC -std=gnu99; -march=rv64gcv -mabi=lp64d for riscv64, plus -mllvm
 * -riscv-v-vector-bits-min=128 with clang; -fopenmp-simd when accepted; then
 * $KILN_DEVICE_CFLAGS; linked -shared -pthread), commands run by fork/execvp with an argument
 * list, never a shell. Words of the environment variables are split on whitespace (no shell
 * quoting).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rt_internal.h"
#include "rt_jit.h"

int kiln_args_push(KilnArgs* a, const char* word) {
  if (a->argc + 2 > a->cap) {
    int cap = a->cap ? 2 * a->cap : 16;
    char** grown = (char**)realloc(a->argv, (size_t)cap * sizeof(char*));
    if (grown == NULL) return kiln_fail("out of memory");
    a->argv = grown;
    a->cap = cap;
  }
  if ((a->argv[a->argc] = kiln_strndup(word, strlen(word))) == NULL) return -1;
  a->argv[++a->argc] = NULL;
  return 0;
}

int kiln_args_split(KilnArgs* a, const char* words) {
  while (words && *words) {
    const char* end;
    char word[4096];
    while (isspace((unsigned char)*words)) ++words;
    if (!*words) break;
    for (end = words; *end && !isspace((unsigned char)*end); ++end) {
    }
    if ((size_t)(end - words) >= sizeof(word)) return kiln_fail("a word longer than 4 KiB");
    memcpy(word, words, (size_t)(end - words));
    word[end - words] = '\0';
    if (kiln_args_push(a, word) != 0) return -1;
    words = end;
  }
  return 0;
}

void kiln_args_free(KilnArgs* a) {
  int i;
  for (i = 0; i < a->argc; ++i) free(a->argv[i]);
  free(a->argv);
  memset(a, 0, sizeof(*a));
}

char* kiln_args_join(const KilnArgs* a, int from) {
  size_t n = 1;
  int i;
  char* s;
  for (i = from; i < a->argc; ++i) n += strlen(a->argv[i]) + 1;
  if ((s = (char*)kiln_calloc(n, 1)) == NULL) return NULL;
  for (i = from; i < a->argc; ++i) {
    if (i > from) strcat(s, " ");
    strcat(s, a->argv[i]);
  }
  return s;
}

static char* kiln_read_fd(int fd) {
  size_t n = 0, cap = 4096;
  char* s = (char*)malloc(cap);
  ssize_t got;
  if (s == NULL) return NULL;
  lseek(fd, 0, SEEK_SET);
  while ((got = read(fd, s + n, cap - n - 1)) > 0) {
    n += (size_t)got;
    if (cap - n < 2) {
      char* grown = (char*)realloc(s, cap *= 2);
      if (grown == NULL) break;
      s = grown;
    }
  }
  s[n] = '\0';
  return s;
}

static int kiln_tmpfile(void) {
  char path[] = "/tmp/kiln-run-XXXXXX";
  int fd = mkstemp(path);
  if (fd >= 0) unlink(path);
  return fd;
}

int kiln_spawn(char* const* argv, int want_out, int want_err, KilnChild* child) {
  child->fd_out = want_out ? kiln_tmpfile() : -1;
  child->fd_err = want_err ? kiln_tmpfile() : -1;
  if ((want_out && child->fd_out < 0) || (want_err && child->fd_err < 0))
    return kiln_fail("cannot create a temp file");
  if ((child->pid = fork()) < 0) return kiln_fail("fork failed: %s", strerror(errno));
  if (child->pid == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(child->fd_out >= 0 ? child->fd_out : null, 1);
    dup2(child->fd_err >= 0 ? child->fd_err : null, 2);
    execvp(argv[0], argv);
    dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  return 0;
}

int kiln_wait(KilnChild* child, char** out, char** err) {
  int status = 0;
  while (waitpid(child->pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (out) *out = child->fd_out >= 0 ? kiln_read_fd(child->fd_out) : NULL;
  if (err) *err = child->fd_err >= 0 ? kiln_read_fd(child->fd_err) : NULL;
  if (child->fd_out >= 0) close(child->fd_out);
  if (child->fd_err >= 0) close(child->fd_err);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int kiln_run_command(char* const* argv, char** out, char** err) {
  KilnChild child;
  if (kiln_spawn(argv, out != NULL, err != NULL, &child) != 0) return -1;
  return kiln_wait(&child, out, err);
}

/* on PATH (execvp's search) */
static int kiln_which(const char* name) {
  const char* path = getenv("PATH");
  char buf[4096];
  if (strchr(name, '/')) return access(name, X_OK) == 0;
  while (path && *path) {
    const char* end = strchr(path, ':');
    size_t n = end ? (size_t)(end - path) : strlen(path);
    snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, name);
    if (access(buf, X_OK) == 0) return 1;
    path = end ? end + 1 : NULL;
  }
  return 0;
}

/* Run cc + extra; its stdout (trimmed), or NULL. */
static char* kiln_cc_output(const KilnArgs* cc, const char* const* extra) {
  KilnArgs a = {0};
  char *out = NULL, *err = NULL;
  int i, rc = -1;
  for (i = 0; i < cc->argc; ++i) kiln_args_push(&a, cc->argv[i]);
  for (i = 0; extra[i]; ++i) kiln_args_push(&a, extra[i]);
  rc = kiln_run_command(a.argv, &out, &err);
  kiln_args_free(&a);
  if (rc != 0 && out) {
    free(out);
    out = NULL;
  }
  if (out) { /* the report of --version/-dumpmachine: stdout + stderr */
    size_t n = strlen(out);
    char* both = (char*)realloc(out, n + (err ? strlen(err) : 0) + 1);
    if (both) {
      strcpy(both + n, err ? err : "");
      out = both;
    }
  }
  free(err);
  return out;
}

/* toolchain._TEMP_NAME.sub("<tmp>", report): in each run of non-space characters, the part up
   to and including the rightmost "/cc" + 6 alphanumerics + "." + word characters. */
static char* kiln_blank_temp_names(const char* s) {
  char* out = (char*)kiln_calloc(strlen(s) + 1 + strlen(s) / 8 * 5, 1);
  size_t o = 0;
  if (out == NULL) return NULL;
  while (*s) {
    const char *run = s, *end = s, *p, *match_end = NULL;
    if (isspace((unsigned char)*s)) {
      out[o++] = *s++;
      continue;
    }
    while (*end && !isspace((unsigned char)*end)) ++end;
    for (p = end - 1; p >= run && match_end == NULL; --p) {
      const char* q = p;
      int k;
      if (end - p < 11 || q[0] != '/' || q[1] != 'c' || q[2] != 'c') continue;
      for (k = 3; k < 9 && isalnum((unsigned char)q[k]); ++k) {
      }
      if (k != 9 || q[9] != '.' || !(isalnum((unsigned char)q[10]) || q[10] == '_')) continue;
      for (q += 10; q < end && (isalnum((unsigned char)*q) || *q == '_'); ++q) {
      }
      match_end = q;
    }
    if (match_end) {
      memcpy(out + o, "<tmp>", 5);
      o += 5;
      run = match_end;
    }
    memcpy(out + o, run, (size_t)(end - run));
    o += (size_t)(end - run);
    s = end;
  }
  out[o] = '\0';
  return out;
}

/* openmp_flags: -fopenmp-simd when the compiler accepts it (the kernels' SIMD pragmas; no
 * OpenMP runtime: parallel loops run on the support code's own pool), else nothing. */
static const char* kiln_openmp_flag(const KilnDeviceToolchain* t) {
  static const char probe[] =
      "void kiln_probe(float* a) {\n#pragma omp simd\nfor (int i = 0; i < 64; ++i) a[i] += "
      "1.0f; }\n";
  char dir[] = "/tmp/kiln-omp-probe-XXXXXX", src[64], obj[64];
  const char* found = NULL;
  KilnArgs a = {0};
  FILE* f;
  int i;
  if (mkdtemp(dir) == NULL) return NULL;
  snprintf(src, sizeof(src), "%s/probe.c", dir);
  snprintf(obj, sizeof(obj), "%s/probe.o", dir);
  f = fopen(src, "w");
  if (f != NULL) {
    fputs(probe, f);
    fclose(f);
    for (i = 0; i < t->cc.argc; ++i) kiln_args_push(&a, t->cc.argv[i]);
    for (i = 0; i < t->flags.argc; ++i) kiln_args_push(&a, t->flags.argv[i]);
    kiln_args_push(&a, "-fopenmp-simd");
    kiln_args_push(&a, "-c");
    kiln_args_push(&a, src);
    kiln_args_push(&a, "-o");
    kiln_args_push(&a, obj);
    if (kiln_run_command(a.argv, NULL, NULL) == 0) found = "-fopenmp-simd";
    kiln_args_free(&a);
  }
  unlink(src);
  unlink(obj);
  rmdir(dir);
  return found;
}

int kiln_device_toolchain(KilnDeviceToolchain* t) {
  static const char* dump[] = {"-dumpmachine", NULL};
  static const char* version[] = {"--version", NULL};
  const char* env = getenv("KILN_DEVICE_CC");
  const char *omp, *extra = getenv("KILN_DEVICE_CFLAGS");
  char *triple, *ver, *report;
  KilnArgs id = {0};
  int i, rc;
  memset(t, 0, sizeof(*t));
  if (env && *env) {
    if (kiln_args_split(&t->cc, env) != 0) return -1;
    if (t->cc.argc == 0 || !kiln_which(t->cc.argv[0]))
      return kiln_fail("device compiler $KILN_DEVICE_CC='%s' not found: install it or unset "
                       "KILN_DEVICE_CC to use the host C compiler", env);
  } else if ((env = getenv("CC")) && *env) {
    if (kiln_args_split(&t->cc, env) != 0) return -1;
  } else {
    const char* names[] = {"cc", "gcc", "clang"};
    for (i = 0; i < 3 && t->cc.argc == 0; ++i)
      if (kiln_which(names[i])) kiln_args_push(&t->cc, names[i]);
    if (t->cc.argc == 0) return kiln_fail("no C compiler found (looked for $KILN_DEVICE_CC, "
                                          "$CC, cc, gcc, clang on PATH)");
  }
  kiln_args_push(&t->flags, "-O3");
  kiln_args_push(&t->flags, "-fPIC");
  kiln_args_push(&t->flags, "-std=gnu99");
  triple = kiln_cc_output(&t->cc, dump);
  if (triple && strncasecmp(triple, "riscv64", 7) == 0) {
    kiln_args_push(&t->flags, "-march=rv64gcv");
    kiln_args_push(&t->flags, "-mabi=lp64d");
    ver = kiln_cc_output(&t->cc, version);
    for (i = 0; ver && ver[i]; ++i) ver[i] = (char)tolower((unsigned char)ver[i]);
    if (ver && strstr(ver, "clang")) {
      kiln_args_push(&t->flags, "-mllvm");
      kiln_args_push(&t->flags, "-riscv-v-vector-bits-min=128");
    }
    free(ver);
  }
  free(triple);
  /* the probe compiles with flags + $KILN_DEVICE_CFLAGS; then flags + omp + extra */
  {
    int base = t->flags.argc;
    if (kiln_args_split(&t->flags, extra) != 0) return -1;
    omp = kiln_openmp_flag(t);
    while (t->flags.argc > base) free(t->flags.argv[--t->flags.argc]);
    t->flags.argv[base] = NULL;
  }
  if (omp) kiln_args_push(&t->flags, omp);
  kiln_args_push(&t->link_flags, "-shared");
  kiln_args_push(&t->link_flags, "-pthread");
  kiln_args_push(&t->link_flags, "-Wl,-Bsymbolic");
  if (kiln_args_split(&t->flags, extra) != 0 || kiln_args_split(&t->link_flags, extra) != 0)
    return -1;
  /* compiler_identity: cc flags -### -c -x c /dev/null -o /dev/null, stderr + stdout */
  for (i = 0; i < t->cc.argc; ++i) kiln_args_push(&id, t->cc.argv[i]);
  for (i = 0; i < t->flags.argc; ++i) kiln_args_push(&id, t->flags.argv[i]);
  {
    static const char* tail[] = {"-###", "-c", "-x", "c", "/dev/null", "-o", "/dev/null"};
    for (i = 0; i < 7; ++i) kiln_args_push(&id, tail[i]);
  }
  {
    char *out = NULL, *err = NULL;
    rc = kiln_run_command(id.argv, &out, &err);
    report = (char*)kiln_calloc((out ? strlen(out) : 0) + (err ? strlen(err) : 0) + 1, 1);
    if (report) {
      strcpy(report, err ? err : "");
      strcat(report, out ? out : "");
    }
    free(out);
    free(err);
  }
  kiln_args_free(&id);
  {
    const char* r = report;
    while (r && isspace((unsigned char)*r)) ++r;
    t->ident = (rc == 0 && r && *r) ? kiln_blank_temp_names(report) : kiln_strndup("", 0);
  }
  free(report);
  return t->ident ? 0 : -1;
}

void kiln_device_toolchain_free(KilnDeviceToolchain* t) {
  kiln_args_free(&t->cc);
  kiln_args_free(&t->flags);
  kiln_args_free(&t->link_flags);
  free(t->ident);
}

/* private_dir: a real directory, ours, not writable by group or others. */
static int kiln_is_private(const char* path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid() &&
         !(st.st_mode & (S_IWGRP | S_IWOTH));
}

static int kiln_mkdirs(char* path) {
  char* p;
  for (p = path + 1; *p; ++p) {
    if (*p != '/') continue;
    *p = '\0';
    mkdir(path, 0700);
    *p = '/';
  }
  return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

int kiln_device_cache_dir(char* out, size_t n) {
  static char fallback[64];
  const char* env = getenv("KILN_CACHE_DIR");
  const char* home = getenv("HOME");
  if (env && *env) snprintf(out, n, "%s/device", env);
  else snprintf(out, n, "%s/.cache/kiln/device", home ? home : "");
  if (kiln_mkdirs(out) == 0 && kiln_is_private(out)) return 0;
  fprintf(stderr, "kiln: device cache folder %s is not private (or cannot be created); using "
                  "a private temp folder instead\n", out);
  if (!fallback[0]) {
    snprintf(fallback, sizeof(fallback), "/tmp/kiln-device-XXXXXX");
    if (mkdtemp(fallback) == NULL) return kiln_fail("cannot create a private temp folder");
  }
  snprintf(out, n, "%s", fallback);
  return 0;
}
