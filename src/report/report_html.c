/*
 * report_html.c — the report page: one HTML document holding its style, its data, the two
 * chart libraries and its script, so it opens from file:// with no network.
 *
 * Layout: header (title, subtitle, notices), the sections timeline / blocks / holders / curves /
 * run (each <section id=...> with a .body the script fills), the third-party notices, then the
 * scripts: the data (<script type="application/json" id="qc-data">), dygraphs, Chart.js, the
 * page script. Text placed inside <script> must not contain "</script" or "<!--" (the HTML
 * tokenizer would end or confuse the element): the data has every '<' written as \u003c (a
 * JSON string escape; '<' never occurs outside strings), and a library holding either
 * sequence is not inlined (treated as missing, with a notice) rather than altered.
 */
#include "report_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define JS_DIR_DEFAULT "/usr/share/javascript"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    char chunk[65536];
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (n + got + 1 > cap) {
            cap = (n + got + 1) * 2;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        memcpy(buf + n, chunk, got);
        n += got;
    }
    const bool bad = ferror(f) != 0;
    fclose(f);
    if (bad || !buf) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* True when text holds s, ignoring ASCII case. */
static bool contains_ci(const char *text, size_t len, const char *s)
{
    const size_t n = strlen(s);
    for (size_t i = 0; i + n <= len; i++)
        if (strncasecmp(text + i, s, n) == 0)
            return true;
    return false;
}

void report_libs_load(const char *js_dir, struct report_lib libs[2])
{
    if (!js_dir)
        js_dir = getenv("QC_REPORT_JS_DIR");
    if (!js_dir || !js_dir[0])
        js_dir = JS_DIR_DEFAULT;
    static const char *const names[2] = {"dygraphs", "Chart.js"};
    static const char *const pkgs[2] = {"libjs-dygraphs", "libjs-chart.js"};
    static const char *const files[2] = {"dygraphs/dygraph.min.js", "chart.js/chart.min.js"};
    for (int i = 0; i < 2; i++) {
        struct report_lib *l = &libs[i];
        memset(l, 0, sizeof *l);
        l->name = names[i];
        l->package = pkgs[i];
        snprintf(l->path, sizeof l->path, "%s/%s", js_dir, files[i]);
        l->text = read_all(l->path, &l->len);
        if (l->text &&
            (contains_ci(l->text, l->len, "</script") || contains_ci(l->text, l->len, "<!--"))) {
            qc_log(QC_LOG_WARN, "report: %s holds \"</script\" or \"<!--\" and cannot be inlined",
                   l->path);
            free(l->text);
            l->text = NULL;
        }
        if (!l->text) {
            qc_log(QC_LOG_WARN,
                   "report: %s not found at %s: the page shows tables instead of its charts\n"
                   "hint: install Debian's %s (tools/install-deps)",
                   l->name, l->path, l->package);
            continue;
        }
        char lic[512];
        snprintf(lic, sizeof lic, "/usr/share/doc/%s/copyright", l->package);
        l->license = read_all(lic, &l->license_len);
    }
}

void report_libs_free(struct report_lib libs[2])
{
    for (int i = 0; i < 2; i++) {
        free(libs[i].text);
        free(libs[i].license);
        libs[i].text = libs[i].license = NULL;
    }
}

static const char page_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    "<meta name=\"generator\" content=\"qctrain report\">\n<title>";

static const char page_body[] =
    "<header><h1>qctrain memory report</h1><p id=\"subtitle\"></p>\n"
    "<nav><a href=\"#timeline\">timeline</a><a href=\"#blocks\">blocks</a>"
    "<a href=\"#holders\">what holds the peak</a><a href=\"#curves\">curves</a>"
    "<a href=\"#run\">run</a><a href=\"#licenses\">notices</a>"
    "</nav></header>\n<main>\n<div id=\"notices\"></div>\n"
    "<noscript><div class=\"notice\">This report is drawn by its inline script: enable "
    "JavaScript to see it.</div></noscript>\n"
    "<section id=\"timeline\"><h2>Timeline of one step</h2><div class=\"body\"></div></section>\n"
    "<section id=\"blocks\"><h2>Who holds the memory at the peak</h2><div class=\"body\"></div>"
    "</section>\n"
    "<section id=\"holders\"><h2>What holds the peak</h2><div class=\"body\"></div>"
    "</section>\n"
    "<section id=\"curves\"><h2>Curves</h2><div class=\"body\"></div></section>\n"
    "<section id=\"run\"><h2>Run, machine and allocator</h2><div class=\"body\"></div>"
    "</section>\n";

enum qc_status report_html_build(const char *data, size_t data_len, const struct report_lib libs[2],
                                 const char *title, struct qc_strbuf *out)
{
    qc_strbuf_puts(out, page_head);
    qc_strbuf_html(out, title, strlen(title));
    qc_strbuf_puts(out, "</title>\n<style>\n");
    size_t css_len = 0;
    char css_path[4300];
    snprintf(css_path, sizeof css_path, "%.4200s", libs[0].path);
    char *slash = strrchr(css_path, '/');
    char *css = NULL;
    if (libs[0].text && slash) {
        snprintf(slash + 1, sizeof css_path - (size_t)(slash + 1 - css_path), "dygraph.min.css");
        css = read_all(css_path, &css_len);
    }
    if (css && !contains_ci(css, css_len, "</style"))
        qc_strbuf_add(out, css, css_len);
    free(css);
    qc_strbuf_puts(out, "\n");
    qc_strbuf_add(out, report_asset_css, report_asset_css_len);
    qc_strbuf_puts(out, "</style>\n</head>\n<body>\n");
    qc_strbuf_puts(out, page_body);
    /* third-party notices */
    qc_strbuf_puts(out, "<section id=\"licenses\"><h2>Third-party software in this page</h2>"
                        "<div class=\"body\">");
    for (int i = 0; i < 2; i++) {
        const struct report_lib *l = &libs[i];
        qc_strbuf_puts(out, "<details><summary>");
        qc_strbuf_html(out, l->name, strlen(l->name));
        qc_strbuf_puts(out, " (Debian package ");
        qc_strbuf_html(out, l->package, strlen(l->package));
        qc_strbuf_puts(out, l->text ? ", inlined from " : ", NOT found at ");
        qc_strbuf_html(out, l->path, strlen(l->path));
        qc_strbuf_puts(out, ")</summary><pre>");
        if (l->license)
            qc_strbuf_html(out, l->license, l->license_len);
        else if (l->text)
            qc_strbuf_puts(out, "The library's license header is kept at the top of its inlined "
                                "script (MIT license).");
        qc_strbuf_puts(out, "</pre></details>\n");
    }
    qc_strbuf_puts(out, "</div></section>\n</main>\n");
    /* the data, once */
    qc_strbuf_puts(out, "<script type=\"application/json\" id=\"qc-data\">");
    size_t run = 0;
    for (size_t i = 0; i < data_len; i++) {
        if (data[i] != '<')
            continue;
        qc_strbuf_add(out, data + run, i - run);
        qc_strbuf_puts(out, "\\u003c");
        run = i + 1;
    }
    qc_strbuf_add(out, data + run, data_len - run);
    qc_strbuf_puts(out, "</script>\n");
    for (int i = 0; i < 2; i++) {
        if (!libs[i].text)
            continue;
        qc_strbuf_puts(out, "<script>\n");
        qc_strbuf_add(out, libs[i].text, libs[i].len);
        qc_strbuf_puts(out, "\n</script>\n");
    }
    qc_strbuf_puts(out, "<script>\n");
    qc_strbuf_add(out, report_asset_js, report_asset_js_len);
    qc_strbuf_puts(out, "\n</script>\n</body>\n</html>\n");
    return qc_strbuf_status(out, "report page");
}
