/*
 * A small JSON reader for the graph executor (the target may have no JSON library): the text is
 * split into a flat array of tokens, each knowing where its subtree ends, so lookups walk the
 * array without building a tree (the approach of jsmn-style tokenizers). Strings are kept as
 * byte ranges of the text, escapes undecoded (graph JSON names and dtypes have none). C99.
 */
#ifndef KILN_CRT_JSON_H_
#define KILN_CRT_JSON_H_

#include <stddef.h>
#include <stdint.h>

typedef enum { KILN_JSON_OBJECT, KILN_JSON_ARRAY, KILN_JSON_STRING, KILN_JSON_PRIMITIVE } KilnJsonType;

typedef struct {
  int32_t type;  /* KilnJsonType */
  int32_t start; /* byte range in the text (a string's without its quotes) */
  int32_t end;
  int32_t size;  /* elements of an array, key/value pairs of an object */
  int32_t next;  /* index of the first token after this one's subtree */
} KilnJsonToken;

/* Tokenize js[0..len) into toks[0..max_toks) (toks NULL: only count). Returns the number of
   tokens, or -1 with the error set (malformed text, too deep, too many tokens). */
int KilnJson_Parse(const char* js, size_t len, KilnJsonToken* toks, int max_toks);
/* The value of `key` in object token `obj`, or -1. */
int KilnJson_Get(const char* js, const KilnJsonToken* toks, int obj, const char* key);
/* Element `i` of array token `arr`, or -1. */
int KilnJson_At(const KilnJsonToken* toks, int arr, int i);
/* The integer of a primitive token (or of a string holding one); -1 if it is not one. */
int KilnJson_Int(const char* js, const KilnJsonToken* toks, int tok, int64_t* out);
/* Whether string token `tok` equals `s`. */
int KilnJson_Equals(const char* js, const KilnJsonToken* toks, int tok, const char* s);

#endif /* KILN_CRT_JSON_H_ */
