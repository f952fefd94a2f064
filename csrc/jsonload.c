#include "jsonload.h"

#include <string.h>

/* What one value costs, from above, in malloc chunks (glibc: the request plus
 * 8 bytes, rounded up to 16, at least 32). jansson 2.13/2.14 on 64 bits:
 *  - object: json_object_t (72 -> 80) and its first 8 buckets (128 -> 144);
 *    each member a pair (57 + key -> at most 80 + key) and, as the table
 *    doubles and is copied, up to 3 buckets of 16 bytes;
 *  - array: json_array_t (40 -> 48) and its first table (64 -> 80); each element
 *    up to 3 slots of 8 bytes (the table doubles, the old one freed after);
 *  - string: json_string_t (32 -> 48) and its bytes (n + 1 -> at most n + 24);
 *  - integer, real: 24 -> 32; true, false, null: shared, nothing.
 * The Python value (CPython 3.10-3.13, 64 bits): a dict 64 bytes and its first
 * keys table up to 144, each entry up to 72 as the table grows; a list 64 and 8
 * per item; a str 96 + kind x characters (kind 1, 2 or 4 bytes: the widest
 * character decides); an int 48, a float 32. */
#define TREE_OBJECT 256
#define TREE_MEMBER 128 /* + key bytes */
#define TREE_ARRAY 128
#define TREE_SLOT 24
#define TREE_STRING 72 /* + bytes */
#define TREE_NUMBER 32
#define VALUE_OBJECT 208
#define VALUE_MEMBER 72 /* + the key's str */
#define VALUE_ARRAY 64
#define VALUE_SLOT 8
#define VALUE_STRING 96 /* + kind x characters */
#define VALUE_NUMBER 48

#define DEPTH_TRACKED 2048 /* jansson refuses deeper nesting (JSON_PARSER_MAX_DEPTH) */

typedef struct {
    size_t raw;    /* bytes between the quotes, escapes included */
    size_t chars;  /* characters, from above */
    unsigned kind; /* 1, 2 or 4: the width of a character of the Python str */
} str_scan;

static int hex4(const char *s, size_t n, unsigned *out)
{
    size_t k;
    unsigned v = 0;
    if (n < 4)
        return 0;
    for (k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

/* s[0] is the opening quote; returns the bytes consumed (closing quote included). */
static size_t scan_string(const char *s, size_t n, str_scan *st)
{
    size_t i = 1;
    st->chars = 0;
    st->kind = 1;
    while (i < n && s[i] != '"') {
        unsigned char c = (unsigned char)s[i];
        unsigned cp;
        if (c == '\\' && i + 1 < n) {
            if (s[i + 1] == 'u' && hex4(s + i + 2, n - i - 2, &cp)) {
                if (cp >= 0xD800 && cp <= 0xDFFF)
                    st->kind = 4;
                else if (cp > 0xFF && st->kind < 2)
                    st->kind = 2;
                i += 6;
            } else {
                i += 2;
            }
            st->chars++;
            continue;
        }
        if ((c & 0xC0) != 0x80) /* a character starts here */
            st->chars++;
        if (c >= 0xF0)
            st->kind = 4;
        else if (c >= 0xC4 && st->kind < 2)
            st->kind = 2; /* beyond U+00FF */
        i++;
    }
    st->raw = i - 1;
    return i < n ? i + 1 : i;
}

static void add(size_t *total, size_t n)
{
    *total = n > (size_t)-1 - *total ? (size_t)-1 : *total + n;
}

void cos_json_estimate(const char *s, size_t n, cos_json_cost *cost)
{
    unsigned char in_object[DEPTH_TRACKED / 8];
    size_t i = 0, depth = 0;
    int expect_key = 0;

    memset(cost, 0, sizeof *cost);
    memset(in_object, 0, sizeof in_object);
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        /* where the value about to start goes: 1 object member, 0 array item or top */
        int tracked = depth > 0 && depth <= DEPTH_TRACKED;
        int parent_object = tracked && (in_object[(depth - 1) / 8] >> ((depth - 1) % 8) & 1);
        int untracked = depth > DEPTH_TRACKED; /* either: count both */
        if (c == '"') {
            str_scan st;
            i += scan_string(s + i, n - i, &st);
            if (st.raw > cost->token)
                cost->token = st.raw;
            if (expect_key || untracked) {
                add(&cost->tree, TREE_MEMBER + st.raw);
                add(&cost->value, VALUE_MEMBER + VALUE_STRING + (size_t)st.kind * st.chars);
            }
            if (!expect_key || untracked) {
                add(&cost->tree, TREE_STRING + st.raw + (parent_object ? 0 : TREE_SLOT));
                add(&cost->value, VALUE_STRING + (size_t)st.kind * st.chars + VALUE_SLOT);
            }
            expect_key = 0;
            continue;
        }
        if (c == '{' || c == '[' || c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' ||
            c == 'n') {
            if (!parent_object) {
                add(&cost->tree, TREE_SLOT);
                add(&cost->value, VALUE_SLOT);
            }
        }
        if (c == '{' || c == '[') {
            add(&cost->tree, c == '{' ? TREE_OBJECT : TREE_ARRAY);
            add(&cost->value, c == '{' ? VALUE_OBJECT : VALUE_ARRAY);
            if (depth < DEPTH_TRACKED) {
                if (c == '{')
                    in_object[depth / 8] |= (unsigned char)(1u << (depth % 8));
                else
                    in_object[depth / 8] &= (unsigned char)~(1u << (depth % 8));
            }
            depth++;
            expect_key = c == '{';
            i++;
        } else if (c == '}' || c == ']') {
            if (depth > 0)
                depth--;
            expect_key = 0;
            i++;
        } else if (c == ',') {
            expect_key = parent_object || untracked;
            i++;
        } else if (c == ':') {
            expect_key = 0;
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t start = i;
            add(&cost->tree, TREE_NUMBER);
            add(&cost->value, VALUE_NUMBER);
            while (i < n && (s[i] == '-' || s[i] == '+' || s[i] == '.' || s[i] == 'e' ||
                             s[i] == 'E' || (s[i] >= '0' && s[i] <= '9')))
                i++;
            if (i - start > cost->token)
                cost->token = i - start;
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            /* true, false, null, or a word the lexer keeps whole for its error message */
            size_t start = i;
            while (i < n && ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
                i++;
            if (i - start > cost->token)
                cost->token = i - start;
        } else {
            i++; /* whitespace, or bytes jansson will refuse */
        }
    }
}

size_t cos_json_budget(size_t n)
{
    size_t b = n > (size_t)-1 / COS_JSON_BUDGET_FACTOR ? (size_t)-1 : n * COS_JSON_BUDGET_FACTOR;
    return b > COS_JSON_BUDGET_FLOOR ? b : COS_JSON_BUDGET_FLOOR;
}

size_t cos_json_peak(size_t n, const cos_json_cost *cost, int to_python)
{
    size_t parsing = n, converting = cost->tree;
    add(&parsing, cost->tree);
    add(&parsing, cost->token);
    add(&converting, cost->value);
    return to_python && converting > parsing ? converting : parsing;
}

json_t *cos_json_load(const char *s, size_t n, size_t flags, int to_python, json_error_t *jerr,
                      int *refused)
{
    cos_json_cost cost;
    cos_json_estimate(s, n, &cost);
    *refused = cos_json_peak(n, &cost, to_python) > cos_json_budget(n);
    if (*refused)
        return NULL;
    return json_loadb(s, n, flags, jerr);
}
