/* The CRT's JSON reader: see kiln_crt_json.h. */
#include "kiln_crt_json.h"

#include <string.h>

#include <kiln/c_runtime_api.h>

#define KILN_JSON_MAX_DEPTH 32

typedef struct {
  const char* js;
  size_t len;
  size_t pos;
  KilnJsonToken* toks;
  int max_toks;
  int count;
} KilnJsonParser;

static int kiln_json_fail(const char* msg) {
  TVMAPISetLastError(msg);
  return -1;
}

static void kiln_json_skip_space(KilnJsonParser* p) {
  while (p->pos < p->len) {
    char c = p->js[p->pos];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') break;
    ++p->pos;
  }
}

/* A new token (or only a count when there is no array); returns its index or -1. */
static int kiln_json_new(KilnJsonParser* p, int type, size_t start) {
  int idx = p->count;
  if (p->toks != NULL) {
    if (idx >= p->max_toks) return kiln_json_fail("graph JSON: too many tokens");
    p->toks[idx].type = type;
    p->toks[idx].start = (int32_t)start;
    p->toks[idx].end = (int32_t)start;
    p->toks[idx].size = 0;
    p->toks[idx].next = idx + 1;
  }
  ++p->count;
  return idx;
}

static int kiln_json_value(KilnJsonParser* p, int depth);

static int kiln_json_string(KilnJsonParser* p) {
  size_t start = ++p->pos; /* after the opening quote */
  while (p->pos < p->len && p->js[p->pos] != '"') {
    if (p->js[p->pos] == '\\') ++p->pos; /* keep escapes as they are */
    ++p->pos;
  }
  if (p->pos >= p->len) return kiln_json_fail("graph JSON: unterminated string");
  int idx = kiln_json_new(p, KILN_JSON_STRING, start);
  if (idx < 0) return -1;
  if (p->toks != NULL) p->toks[idx].end = (int32_t)p->pos;
  ++p->pos;
  return idx;
}

static int kiln_json_container(KilnJsonParser* p, int depth, int is_object) {
  char close = is_object ? '}' : ']';
  int idx = kiln_json_new(p, is_object ? KILN_JSON_OBJECT : KILN_JSON_ARRAY, p->pos);
  int size = 0;
  if (idx < 0) return -1;
  ++p->pos;
  kiln_json_skip_space(p);
  if (p->pos < p->len && p->js[p->pos] == close) {
    ++p->pos;
  } else {
    for (;;) {
      kiln_json_skip_space(p);
      if (is_object) {
        if (p->pos >= p->len || p->js[p->pos] != '"')
          return kiln_json_fail("graph JSON: expected a string key");
        if (kiln_json_string(p) < 0) return -1;
        kiln_json_skip_space(p);
        if (p->pos >= p->len || p->js[p->pos] != ':')
          return kiln_json_fail("graph JSON: expected ':'");
        ++p->pos;
      }
      if (kiln_json_value(p, depth + 1) < 0) return -1;
      ++size;
      kiln_json_skip_space(p);
      if (p->pos < p->len && p->js[p->pos] == ',') {
        ++p->pos;
        continue;
      }
      if (p->pos < p->len && p->js[p->pos] == close) {
        ++p->pos;
        break;
      }
      return kiln_json_fail("graph JSON: expected ',' or a closing bracket");
    }
  }
  if (p->toks != NULL) {
    p->toks[idx].end = (int32_t)p->pos;
    p->toks[idx].size = size;
    p->toks[idx].next = p->count;
  }
  return idx;
}

static int kiln_json_value(KilnJsonParser* p, int depth) {
  if (depth > KILN_JSON_MAX_DEPTH) return kiln_json_fail("graph JSON: nested too deeply");
  kiln_json_skip_space(p);
  if (p->pos >= p->len) return kiln_json_fail("graph JSON: unexpected end of text");
  char c = p->js[p->pos];
  if (c == '{' || c == '[') return kiln_json_container(p, depth, c == '{');
  if (c == '"') return kiln_json_string(p);
  /* numbers, true, false, null */
  size_t start = p->pos;
  while (p->pos < p->len) {
    c = p->js[p->pos];
    if (c == ',' || c == ']' || c == '}' || c == ' ' || c == '\n' || c == '\r' || c == '\t')
      break;
    ++p->pos;
  }
  if (p->pos == start) return kiln_json_fail("graph JSON: unexpected character");
  int idx = kiln_json_new(p, KILN_JSON_PRIMITIVE, start);
  if (idx >= 0 && p->toks != NULL) p->toks[idx].end = (int32_t)p->pos;
  return idx;
}

int KilnJson_Parse(const char* js, size_t len, KilnJsonToken* toks, int max_toks) {
  KilnJsonParser p;
  if (len > (size_t)INT32_MAX) return kiln_json_fail("graph JSON: text larger than 2 GiB");
  p.js = js;
  p.len = len;
  p.pos = 0;
  p.toks = toks;
  p.max_toks = max_toks;
  p.count = 0;
  if (kiln_json_value(&p, 0) < 0) return -1;
  kiln_json_skip_space(&p);
  if (p.pos != len && js[p.pos] != '\0') return kiln_json_fail("graph JSON: text after the value");
  return p.count;
}

int KilnJson_Equals(const char* js, const KilnJsonToken* toks, int tok, const char* s) {
  size_t n = strlen(s);
  const KilnJsonToken* t = &toks[tok];
  return t->type == KILN_JSON_STRING && (size_t)(t->end - t->start) == n &&
         memcmp(js + t->start, s, n) == 0;
}

int KilnJson_Get(const char* js, const KilnJsonToken* toks, int obj, const char* key) {
  int i, k;
  if (obj < 0 || toks[obj].type != KILN_JSON_OBJECT) return -1;
  k = obj + 1;
  for (i = 0; i < toks[obj].size; ++i) {
    int value = k + 1;
    if (KilnJson_Equals(js, toks, k, key)) return value;
    k = toks[value].next;
  }
  return -1;
}

int KilnJson_At(const KilnJsonToken* toks, int arr, int i) {
  int k, j;
  if (arr < 0 || toks[arr].type != KILN_JSON_ARRAY || i < 0 || i >= toks[arr].size) return -1;
  k = arr + 1;
  for (j = 0; j < i; ++j) k = toks[k].next;
  return k;
}

int KilnJson_Int(const char* js, const KilnJsonToken* toks, int tok, int64_t* out) {
  const KilnJsonToken* t;
  int32_t i;
  int neg = 0;
  int64_t v = 0;
  if (tok < 0) return -1;
  t = &toks[tok];
  if (t->type != KILN_JSON_PRIMITIVE && t->type != KILN_JSON_STRING) return -1;
  i = t->start;
  if (i < t->end && js[i] == '-') {
    neg = 1;
    ++i;
  }
  if (i >= t->end) return -1;
  for (; i < t->end; ++i) {
    char c = js[i];
    if (c < '0' || c > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (c - '0');
  }
  *out = neg ? -v : v;
  return 0;
}
