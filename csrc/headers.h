/* Response header lines as libcurl hands them to the header callback: one line,
 * its CRLF included, NOT NUL-terminated. Read only through bounded copies. */
#ifndef COS_HEADERS_H
#define COS_HEADERS_H

#include <stddef.h>

#include "common.h"

typedef enum {
    COS_HDR_OTHER,          /* a header we do not read */
    COS_HDR_STATUS,         /* "HTTP/...": a new response (after a 100 Continue, say); meta reset */
    COS_HDR_CONTENT_LENGTH, /* a well-formed Content-Length, in *content_length */
    COS_HDR_END,            /* the blank line that ends the headers */
} cos_hdr_kind;

/* Reads the status, X-Request-Id (else X-Fc-Request-Id) and Retry-After into meta. */
cos_hdr_kind cos_header_line(cos_meta *meta, const char *line, size_t n,
                             unsigned long long *content_length);

#endif
