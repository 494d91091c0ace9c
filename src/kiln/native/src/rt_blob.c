/*
 * Unpack the imports blob __tvm_dev_mblob into a module tree (TVM's ProcessModuleBlob in
 * src/runtime/library_module.cc; Kiln's kiln/runtime/blob.py, whose checks this file repeats):
 *
 *     payload := u64 num_entries  entry*num_entries
 *     entry   := string "_lib" | string "_import_tree" vec<u64> row_ptr vec<u64> child_indices
 *              | string <type_key> string <module bytes>
 *
 * Every length is checked against the bytes that remain, so a damaged blob is an error naming
 * what was found, never a read out of bounds. Also the stream reader and the NDArray reader of
 * the params format (docs/formats.md §1 and §5).
 */
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

#define KILN_NDARRAY_MAGIC 0xDD5E40F096B4A13FULL
#define KILN_MAX_NAME 256

/* -- stream reader (little-endian whatever the host) */
static uint64_t kiln_le(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  size_t i;
  for (i = 0; i < n; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static int kiln_truncated(KilnStream* s, size_t need, const char* field) {
  return kiln_fail("%s: truncated: %s needs %zu bytes, %zu left", s->what, field, need, s->left);
}

int kiln_skip(KilnStream* s, size_t n, const char* field) {
  if (s->left < n) return kiln_truncated(s, n, field);
  s->p += n;
  s->left -= n;
  return 0;
}

int kiln_read_u64(KilnStream* s, uint64_t* out, const char* field) {
  if (s->left < 8) return kiln_truncated(s, 8, field);
  *out = kiln_le(s->p, 8);
  return kiln_skip(s, 8, field);
}

int kiln_read_u32(KilnStream* s, uint32_t* out, const char* field) {
  if (s->left < 4) return kiln_truncated(s, 4, field);
  *out = (uint32_t)kiln_le(s->p, 4);
  return kiln_skip(s, 4, field);
}

int kiln_read_bytes(KilnStream* s, const uint8_t** data, size_t* n, const char* field) {
  uint64_t len;
  if (kiln_read_u64(s, &len, field) != 0) return -1;
  if (len > s->left)
    return kiln_fail("%s: corrupt: %s claims %llu bytes, %zu left", s->what, field,
                     (unsigned long long)len, s->left);
  *data = s->p;
  *n = (size_t)len;
  return kiln_skip(s, (size_t)len, field);
}

int kiln_read_count(KilnStream* s, size_t item_size, uint64_t* out, const char* field) {
  if (kiln_read_u64(s, out, field) != 0) return -1;
  if (*out > s->left / (item_size ? item_size : 1))
    return kiln_fail("%s: corrupt: %s %llu, but only %zu bytes left", s->what, field,
                     (unsigned long long)*out, s->left);
  return 0;
}

int kiln_read_ndarray(KilnStream* s, KilnArrayView* a, const char* field) {
  uint64_t magic, reserved, nbytes, expect;
  uint32_t ndim, dtype;
  int i;
  if (kiln_read_u64(s, &magic, field) != 0) return -1;
  if (magic != KILN_NDARRAY_MAGIC)
    return kiln_fail("%s: corrupt %s: bad magic 0x%016llX", s->what, field,
                     (unsigned long long)magic);
  if (kiln_read_u64(s, &reserved, field) != 0 || kiln_skip(s, 8, field) != 0 ||
      kiln_read_u32(s, &ndim, field) != 0 || kiln_read_u32(s, &dtype, field) != 0)
    return -1;
  if (ndim > 32) return kiln_fail("%s: corrupt %s: ndim %d", s->what, field, (int32_t)ndim);
  a->ndim = (int32_t)ndim;
  a->dtype.code = (uint8_t)(dtype & 0xff);
  a->dtype.bits = (uint8_t)((dtype >> 8) & 0xff);
  a->dtype.lanes = (uint16_t)(dtype >> 16);
  if (a->dtype.lanes != 1 || a->dtype.code > 6 ||
      (a->dtype.bits != 8 && a->dtype.bits != 16 && a->dtype.bits != 32 && a->dtype.bits != 64))
    return kiln_fail("%s: corrupt %s: unsupported dtype (code %d, bits %d, lanes %d)", s->what,
                     field, a->dtype.code, a->dtype.bits, a->dtype.lanes);
  expect = a->dtype.bits / 8;
  for (i = 0; i < a->ndim; ++i) {
    uint64_t d;
    if (kiln_read_u64(s, &d, field) != 0) return -1;
    a->shape[i] = (int64_t)d;
    if (a->shape[i] < 0 || (d && expect > UINT64_MAX / 2 / d))
      return kiln_fail("%s: corrupt %s: bad shape", s->what, field);
    expect *= d;
  }
  if (kiln_read_u64(s, &nbytes, field) != 0) return -1;
  if (nbytes != expect)
    return kiln_fail("%s: corrupt %s: nbytes %llu but its shape needs %llu", s->what, field,
                     (unsigned long long)nbytes, (unsigned long long)expect);
  if (nbytes > s->left) return kiln_truncated(s, (size_t)nbytes, field);
  a->data = s->p;
  a->nbytes = nbytes;
  return kiln_skip(s, (size_t)nbytes, field);
}

/* A vec<string> of NUL-free names, duplicates refused (rt_internal.h). */
int kiln_read_names(KilnStream* s, char*** out, size_t* count, const char* field) {
  uint64_t n, i, j;
  const uint8_t* p;
  size_t len;
  if (kiln_read_count(s, 8, &n, field) != 0) return -1;
  if ((*out = (char**)kiln_calloc((size_t)n + 1, sizeof(char*))) == NULL) return -1;
  *count = (size_t)n;
  for (i = 0; i < n; ++i) {
    if (kiln_read_bytes(s, &p, &len, field) != 0) return -1;
    if (memchr(p, 0, len) != NULL) return kiln_fail("%s: corrupt %s: a NUL in a name", s->what, field);
    if (((*out)[i] = kiln_strndup((const char*)p, len)) == NULL) return -1;
    for (j = 0; j < i; ++j)
      if (strcmp((*out)[j], (*out)[i]) == 0)
        return kiln_fail("%s: corrupt %s: '%s' twice", s->what, field, (*out)[i]);
  }
  return 0;
}

/* -- loaders by type_key ("metadata": TVM's name before "const_loader") */
static const struct {
  const char* type_key;
  KilnModuleLoader load;
} kiln_loaders[] = {
    {"GraphExecutorFactory", kiln_load_graph_factory},
    {"const_loader", kiln_load_const_loader},
    {"metadata", kiln_load_const_loader},
    {"kiln_jit", kiln_load_jit},
    {"relax.VMExecutable", kiln_load_vm_executable},
    {"relax.Executable", kiln_load_vm_executable}, /* TVM v0.18's name */
    {"kiln_json", kiln_load_json},
};
#define KILN_NUM_LOADERS (sizeof(kiln_loaders) / sizeof(kiln_loaders[0]))

static int kiln_load_binary(const char* key, const uint8_t* data, size_t n, KilnModule** out) {
  size_t i;
  for (i = 0; i < KILN_NUM_LOADERS; ++i) {
    if (strcmp(kiln_loaders[i].type_key, key) == 0) {
      if (kiln_loaders[i].load(data, n, out) == 0) return 0;
      return kiln_fail("loading module '%s' failed: %s", key, TVMGetLastError());
    }
  }
  return kiln_fail("no loader for module type_key '%s' (this runtime loads GraphExecutorFactory,"
                   " relax.VMExecutable, const_loader, metadata, kiln_jit, kiln_json)", key);
}

/* Iterative depth-first search over the edges between distinct modules (node[i]: the first
   entry holding entry i's module): 0 when acyclic. O(modules + edges): the edges are regrouped
   by node first (a long crafted chain must not make this quadratic). */
static int kiln_check_acyclic(size_t n, const uint64_t* row_ptr, const uint64_t* child,
                              size_t nchild, const size_t* node) {
  size_t* start = (size_t*)kiln_calloc(n + 1, sizeof(size_t));
  size_t* fill = (size_t*)kiln_calloc(n + 1, sizeof(size_t));
  size_t* edge = (size_t*)kiln_calloc(nchild + 1, sizeof(size_t));
  size_t* stack = (size_t*)kiln_calloc(n + 1, sizeof(size_t));
  uint8_t* state = (uint8_t*)kiln_calloc(n + 1, 1); /* 1 on the path, 2 done */
  size_t i, root;
  uint64_t e;
  int rc = 0;
  if (start == NULL || fill == NULL || edge == NULL || stack == NULL || state == NULL) rc = -1;
  for (i = 0; rc == 0 && i < n; ++i) start[node[i] + 1] += (size_t)(row_ptr[i + 1] - row_ptr[i]);
  for (i = 0; rc == 0 && i < n; ++i) start[i + 1] += start[i];
  for (i = 0; rc == 0 && i < n; ++i) {
    for (e = row_ptr[i]; e < row_ptr[i + 1]; ++e)
      edge[start[node[i]] + fill[node[i]]++] = node[child[e]];
  }
  for (i = 0; rc == 0 && i < n; ++i) fill[i] = start[i]; /* fill: next edge to visit */
  for (root = 0; rc == 0 && root < n; ++root) {
    size_t depth = 1;
    if (node[root] != root || state[root]) continue;
    stack[0] = root;
    state[root] = 1;
    while (depth > 0 && rc == 0) {
      size_t cur = stack[depth - 1], next;
      if (fill[cur] == start[cur + 1]) {
        state[cur] = 2;
        --depth;
        continue;
      }
      next = edge[fill[cur]++];
      if (state[next] == 1) {
        rc = kiln_fail("corrupt import tree: a cycle through modules %zu and %zu", cur, next);
      } else if (state[next] == 0) {
        state[next] = 1;
        stack[depth++] = next;
      }
    }
  }
  free(start);
  free(fill);
  free(edge);
  free(stack);
  free(state);
  return rc;
}

static int kiln_link_imports(KilnModule** mods, size_t n, KilnModule* lib, const uint64_t* row_ptr,
                             size_t nrow, const uint64_t* child, size_t nchild) {
  size_t i, j;
  size_t* node;
  int rc;
  if (nrow != n + 1 || row_ptr[0] != 0 || row_ptr[n] != nchild)
    return kiln_fail("corrupt import tree: row_ptr does not fit %zu modules and %zu children", n,
                     nchild);
  for (i = 0; i < n; ++i)
    if (row_ptr[i] > row_ptr[i + 1])
      return kiln_fail("corrupt import tree: row_ptr is not monotone");
  for (i = 0; i < nchild; ++i)
    if (child[i] >= n)
      return kiln_fail("corrupt import tree: child index out of range (have %zu modules)", n);
  /* modules by identity: only the library can stand in several entries (each loader returns a
     new module), so an entry maps to itself or to the library's first entry */
  if ((node = (size_t*)kiln_calloc(n, sizeof(size_t))) == NULL) return -1;
  for (i = 0, j = n; i < n; ++i) {
    node[i] = i;
    if (mods[i] == lib) {
      if (j == n) j = i;
      node[i] = j;
    }
  }
  rc = kiln_check_acyclic(n, row_ptr, child, nchild, node);
  free(node);
  for (i = 0; rc == 0 && i < n; ++i)
    for (j = (size_t)row_ptr[i]; rc == 0 && j < row_ptr[i + 1]; ++j)
      rc = kiln_module_add_import(mods[i], mods[child[j]]);
  return rc;
}

/* A vec<u64>, borrowed as raw little-endian words copied out. */
static int kiln_read_vec_u64(KilnStream* s, uint64_t** out, size_t* n, const char* field) {
  uint64_t count, i;
  if (kiln_read_count(s, 8, &count, field) != 0) return -1;
  if ((*out = (uint64_t*)kiln_calloc((size_t)count + 1, sizeof(uint64_t))) == NULL) return -1;
  for (i = 0; i < count; ++i) kiln_read_u64(s, &(*out)[i], field);
  *n = (size_t)count;
  return 0;
}

int kiln_unpack_imports(const uint8_t* payload, size_t nbytes, KilnModule* lib,
                        KilnModule** out) {
  KilnStream s = {payload, nbytes, "__tvm_dev_mblob"};
  uint64_t num_entries = 0, i;
  KilnModule** mods = NULL;
  size_t nmods = 0, nrow = 0, nchild = 0;
  uint64_t *row_ptr = NULL, *child = NULL;
  int have_tree = 0, rc = -1;
  *out = NULL;
  if (kiln_read_count(&s, 8, &num_entries, "entry count") != 0) return -1;
  if ((mods = (KilnModule**)kiln_calloc((size_t)num_entries + 1, sizeof(*mods))) == NULL)
    return -1;
  for (i = 0; i < num_entries; ++i) {
    const uint8_t* key;
    size_t key_n;
    char name[KILN_MAX_NAME];
    if (kiln_read_bytes(&s, &key, &key_n, "entry key") != 0) goto done;
    if (key_n >= sizeof(name) || memchr(key, 0, key_n) != NULL) {
      kiln_fail("__tvm_dev_mblob: corrupt: entry %llu key is not a type_key",
                (unsigned long long)i);
      goto done;
    }
    memcpy(name, key, key_n);
    name[key_n] = '\0';
    if (have_tree) {
      kiln_fail("__tvm_dev_mblob: corrupt: entry '%s' after _import_tree", name);
      goto done;
    }
    if (strcmp(name, "_lib") == 0) {
      if (lib == NULL) {
        kiln_fail("__tvm_dev_mblob: blob refers to _lib but there is no library module");
        goto done;
      }
      kiln_module_retain(lib);
      mods[nmods++] = lib;
    } else if (strcmp(name, "_import_tree") == 0) {
      if (kiln_read_vec_u64(&s, &row_ptr, &nrow, "import tree row_ptr") != 0 ||
          kiln_read_vec_u64(&s, &child, &nchild, "import tree child_indices") != 0)
        goto done;
      have_tree = 1;
    } else {
      const uint8_t* data;
      size_t n;
      if (kiln_read_bytes(&s, &data, &n, "module bytes") != 0 ||
          kiln_load_binary(name, data, n, &mods[nmods]) != 0)
        goto done;
      ++nmods;
    }
  }
  if (s.left) {
    kiln_fail("__tvm_dev_mblob: corrupt: %zu trailing bytes after %llu entries", s.left,
              (unsigned long long)num_entries);
    goto done;
  }
  if (nmods == 0) {
    if (lib == NULL) {
      kiln_fail("__tvm_dev_mblob: blob holds no module");
      goto done;
    }
    kiln_module_retain(lib);
    *out = lib;
    rc = 0;
    goto done;
  }
  if (have_tree) {
    if (kiln_link_imports(mods, nmods, lib, row_ptr, nrow, child, nchild) != 0) goto done;
  } else if (lib != NULL && nmods > 1) { /* TVM < 0.7: the library imports every other module */
    for (i = 0; i < nmods; ++i)
      if (mods[i] != lib && kiln_module_add_import(lib, mods[i]) != 0) goto done;
  }
  kiln_module_retain(mods[0]);
  *out = mods[0];
  rc = 0;
done:
  for (i = 0; i < nmods; ++i) kiln_module_release(mods[i]);
  free(mods);
  free(row_ptr);
  free(child);
  return rc;
}

KILN_EXPORT int KilnModLoadFromBlob(const void* payload, size_t nbytes, TVMModuleHandle lib,
                                    TVMModuleHandle* out) {
  if ((payload == NULL && nbytes) || out == NULL)
    return kiln_fail("KilnModLoadFromBlob: null argument");
  return kiln_unpack_imports((const uint8_t*)payload, nbytes, (KilnModule*)lib,
                             (KilnModule**)out);
}
