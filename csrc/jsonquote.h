/* Request bodies carry a caller's text (an exec's stdin: the executor's runner and
 * its flow, tens of kilobytes) as a JSON string. jansson checks and escapes such a
 * string one code point at a time (about 1 ms for the executor's 86 KB); this does
 * the same in two passes, the second copying runs of plain bytes whole. */
#ifndef COS_JSONQUOTE_H
#define COS_JSONQUOTE_H

#include <stddef.h>

#include "common.h"

/* Appends s[0..n) to out as a JSON string, quotes included, escaped as jansson's
 * json_dumps escapes it (\" \\ \b \f \n \r \t, \u00XX for other control bytes,
 * everything else as is). 0; else out is as it was and the result says why. */
#define COS_QUOTE_NOMEM (-1)    /* out cannot grow */
#define COS_QUOTE_NOT_UTF8 (-2) /* s is not valid UTF-8 (RFC 3629) */
int cos_json_quote(cos_buf *out, const char *s, size_t n);

#endif
