/* S2's floor: the client CPU any libcurl client pays for one backend run's wire traffic.
 *
 *     s2_floor BASE_URL CREATE_BODY_FILE EXEC_BODY_FILE RUNS   (key: CREATEOS_SANDBOX_API_KEY)
 *
 * One thread, one easy handle kept for every request (one kept-alive connection), and only
 * what a backend run must do on the wire: POST /v1/sandboxes with the backend's create body
 * (CREATE_BODY_FILE, a name added per run), the streamed exec of the backend's own request
 * body (EXEC_BODY_FILE), each NDJSON frame parsed, and the DELETE. The driver writes both
 * files from what our backend would send. No Python, no threads, no
 * settings, no checks beyond the status and the sandbox id. Two runs warm the connection
 * first, as the plugins' workers are warm. Prints one JSON object: user + system CPU of this
 * process per run over the next RUNS runs, and the failures of all of them (getrusage, as S2 measures the workers).
 * benchmarks/run.py builds it and interleaves it with the two plugins in S2. */
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define WARM_RUNS 2

typedef struct {
    char *data;
    size_t len, cap;
} buf;

typedef struct {
    buf line;     /* the NDJSON frame being assembled */
    int exit_code;
    int frames;
} ndjson;

static size_t to_buf(char *p, size_t size, size_t n, void *ud)
{
    buf *b = ud;
    size_t add = size * n;
    if (b->len + add + 1 > b->cap) {
        size_t cap = (b->len + add + 1) * 2;
        char *d = realloc(b->data, cap);
        if (d == NULL)
            return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, add);
    b->len += add;
    b->data[b->len] = '\0';
    return add;
}

static void frame(ndjson *s, const char *text, size_t n)
{
    json_t *f = json_loadb(text, n, 0, NULL);
    json_t *code = json_object_get(f, "exit_code");
    s->frames++;
    if (json_is_integer(code))
        s->exit_code = (int)json_integer_value(code);
    json_decref(f);
}

static size_t to_frames(char *p, size_t size, size_t n, void *ud)
{
    ndjson *s = ud;
    size_t add = size * n, start = 0, i;
    for (i = 0; i < add; i++) {
        if (p[i] != '\n')
            continue;
        if (s->line.len > 0) {
            if (to_buf(p + start, 1, i - start, &s->line) != i - start)
                return 0;
            frame(s, s->line.data, s->line.len);
            s->line.len = 0;
        } else {
            frame(s, p + start, i - start);
        }
        start = i + 1;
    }
    if (start < add && to_buf(p + start, 1, add - start, &s->line) != add - start)
        return 0;
    return add;
}

/* One request on the shared handle, its answer's body handed to `sink` with `ud`.
 * Returns the HTTP status (0 when the transfer failed). */
static long request(CURL *h, struct curl_slist *hdrs, const char *method, const char *url,
                    const char *body, curl_write_callback sink, void *ud)
{
    long status = 0;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    if (body != NULL)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    else
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L); /* no body: drop the last request's */
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, ud);
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    return status;
}

/* User + system CPU seconds of this process. (Not split: the kernel divides the total
 * between the two by tick samples, which at this scale is noise.) */
static double cpu_seconds(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
           (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    buf b = {0};
    char chunk[4096];
    size_t n;
    if (f == NULL)
        return NULL;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (to_buf(chunk, 1, n, &b) != n)
            break;
    fclose(f);
    return b.data;
}

int main(int argc, char **argv)
{
    const char *base, *key = getenv("CREATEOS_SANDBOX_API_KEY");
    char *exec_body, *create_body = NULL, url[512], name[64], auth[256];
    json_t *create_spec;
    struct curl_slist *json_hdrs = NULL, *ndjson_hdrs = NULL;
    int runs, i, failures = 0;
    double cpu0 = 0;
    CURL *h;

    if (argc != 5 || key == NULL || (runs = atoi(argv[4])) <= 0) {
        fprintf(stderr, "usage: CREATEOS_SANDBOX_API_KEY=... s2_floor URL CREATE EXEC RUNS\n");
        return 2;
    }
    base = argv[1];
    if ((create_spec = json_load_file(argv[2], 0, NULL)) == NULL ||
        (exec_body = slurp(argv[3])) == NULL) {
        fprintf(stderr, "s2_floor: cannot read %s or %s\n", argv[2], argv[3]);
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    h = curl_easy_init();
    snprintf(auth, sizeof auth, "X-Api-Key: %s", key);
    json_hdrs = curl_slist_append(json_hdrs, auth);
    json_hdrs = curl_slist_append(json_hdrs, "Accept: application/json");
    json_hdrs = curl_slist_append(json_hdrs, "Content-Type: application/json");
    ndjson_hdrs = curl_slist_append(ndjson_hdrs, auth);
    ndjson_hdrs = curl_slist_append(ndjson_hdrs, "Accept: application/x-ndjson, application/json");
    ndjson_hdrs = curl_slist_append(ndjson_hdrs, "Content-Type: application/json");

    for (i = -WARM_RUNS; i < runs; i++) {
        buf answer = {0};
        ndjson exec = {{0}, -1, 0};
        json_t *created = NULL;
        const char *id;

        if (i == 0)
            cpu0 = cpu_seconds();
        snprintf(name, sizeof name, "floor-%d-%d", (int)getpid(), i + WARM_RUNS);
        json_object_set_new(create_spec, "name", json_string(name));
        free(create_body);
        create_body = json_dumps(create_spec, JSON_COMPACT);
        snprintf(url, sizeof url, "%s/v1/sandboxes", base);
        id = NULL;
        if (request(h, json_hdrs, "POST", url, create_body, to_buf, &answer) == 200 &&
            (created = json_loads(answer.data, 0, NULL)) != NULL)
            id = json_string_value(json_object_get(json_object_get(created, "data"), "id"));
        if (id == NULL) {
            failures++;
        } else {
            snprintf(url, sizeof url, "%s/v1/sandboxes/%s/exec?stream=true", base, id);
            if (request(h, ndjson_hdrs, "POST", url, exec_body, to_frames, &exec) != 200 ||
                exec.exit_code != 0)
                failures++;
            answer.len = 0;
            snprintf(url, sizeof url, "%s/v1/sandboxes/%s", base, id);
            if (request(h, json_hdrs, "DELETE", url, NULL, to_buf, &answer) != 200)
                failures++;
        }
        json_decref(created);
        free(answer.data);
        free(exec.line.data);
    }
    printf("{\"cpu_per_run\": %.9f, \"runs\": %d, \"warm_runs\": %d, \"failures\": %d}\n",
           (cpu_seconds() - cpu0) / runs, runs, WARM_RUNS, failures);
    curl_slist_free_all(json_hdrs);
    curl_slist_free_all(ndjson_hdrs);
    curl_easy_cleanup(h);
    curl_global_cleanup();
    free(exec_body);
    free(create_body);
    json_decref(create_spec);
    return failures ? 1 : 0;
}
