/* JSON from a server, parsed within a memory bound. jansson builds a node of
 * tens of bytes for each value (an object: hundreds), so a body of "{}," takes
 * about 100 times its size as a tree, and the Python value made from it as
 * much again. Before parsing, one linear pass over the bytes estimates, from
 * above, what the tree, the lexer and the Python value will take; a body whose
 * estimate passes the budget is refused instead of parsed. */
#ifndef COS_JSONLOAD_H
#define COS_JSONLOAD_H

#include <jansson.h>
#include <stddef.h>

#include "compat.h"

/* Everything a parse may hold at once, beyond the body itself: */
#define COS_JSON_BUDGET_FACTOR 4                 /* ... at most 4 x the body */
#define COS_JSON_BUDGET_FLOOR ((size_t)32 << 20) /* ... or 32 MiB, for small bodies */

typedef struct cos_json_cost {
    size_t tree;  /* jansson's nodes, keys, tables (malloc chunks) */
    size_t token; /* the longest token (string, number, word) the lexer holds while
                     it decodes it: its buffer doubles as it grows, but only the
                     bytes written are touched (resident): counted once */
    size_t value; /* the Python objects cos_json_to_py makes from the tree */
} cos_json_cost;

/* Upper bounds for parsing s[0..n) (or any prefix of it: a parse that fails
 * half-way has built part of the tree). No allocation; bytes that are not JSON
 * are skipped. */
void cos_json_estimate(const char *s, size_t n, cos_json_cost *cost);
/* max(COS_JSON_BUDGET_FACTOR x n, COS_JSON_BUDGET_FLOOR) */
size_t cos_json_budget(size_t n);
/* The peak a parse of n bytes with this cost reaches: the body, the tree and
 * the lexer's token while parsing; then the tree and the Python value while
 * converting (to_python), the body being freed by then. */
size_t cos_json_peak(size_t n, const cos_json_cost *cost, int to_python);

/* json_loadb(s, n, flags) when the peak fits the budget. Otherwise NULL with
 * *refused set and nothing allocated; NULL with *refused 0 is json_loadb's own
 * failure (jerr set). */
json_t *cos_json_load(const char *s, size_t n, size_t flags, int to_python, json_error_t *jerr,
                      int *refused);

#endif
