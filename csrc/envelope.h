/* JSend envelopes, pagination and the buffered exec result: every byte here
 * comes from the server, so every field's type is checked and nothing is
 * trusted to be small. */
#ifndef COS_ENVELOPE_H
#define COS_ENVELOPE_H

#include <jansson.h>

#include "common.h"

/* Largest JSON body accepted for a control-plane call. */
#define COS_JSON_BODY_MAX ((size_t)64 << 20)

/* Parse a JSON response. On a 2xx success envelope returns 0 with *data a new
 * reference (json null when the envelope has no data). Otherwise returns -1
 * and fills err: the class from the HTTP status, the server's message
 * (redacted of `secret`, at most COS_SERVER_TEXT_MAX characters), its
 * machine code, request id and Retry-After. A body whose parse would pass the
 * memory budget (jsonload.h; to_python: the data becomes a Python value too)
 * is a protocol error, refused before it is parsed. */
int cos_envelope_parse(const char *op, const cos_meta *meta, const char *body, size_t len,
                       int to_python, const char *secret, cos_err *err, json_t **data);

/* Fill err for a response whose status is not 2xx. */
void cos_error_from_response(const char *op, const cos_meta *meta, const char *body, size_t len,
                             const char *secret, cos_err *err);

/* Items of one page of a list: {"data":[...],"pagination":{"total":N}}, or
 * the legacy {legacy_key:[...]} or a bare array. Every item must be an
 * object. *total is -1 when the server did not say. */
int cos_page_items(const char *op, json_t *data, const char *legacy_key, json_t **items,
                   long long *total, cos_err *err);

/* The data of a buffered exec: {"result":{"stdout","stderr","exit_code","error"},"exec_ms"}.
 * Output goes through x's caps. */
int cos_exec_result_parse(const char *op, json_t *data, cos_exec_out *x, cos_err *err);

#endif
