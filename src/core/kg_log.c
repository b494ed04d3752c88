/* kg_log: logfmt or JSON lines on stderr, one write(2)-sized fputs per line
 * so lines from two threads do not interleave. */
#include "kg_log.h"

#include <string.h>
#include <time.h>

_Atomic int kg_log_min_level = KG_LOG_LEVEL_INFO;

int kg_log_min_level_get(void) {
    return atomic_load_explicit(&kg_log_min_level, memory_order_relaxed);
}
static kg_log_format_t log_format = KG_LOG_FORMAT_LOGFMT;

static const char *level_names[] = {"debug", "info", "warn", "error", "off"};

void kg_log_setup(kg_log_level_t level, kg_log_format_t format) {
    atomic_store_explicit(&kg_log_min_level, (int)level, memory_order_relaxed);
    log_format = format;
}

int kg_log_level_parse(const char *s) {
    for (int i = 0; i <= KG_LOG_LEVEL_OFF; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            return i;
        }
    }
    if (strcmp(s, "warning") == 0) {
        return KG_LOG_LEVEL_WARN;
    }
    return -1;
}

/* Append `s` escaped for a JSON string or a logfmt quoted value (both accept
 * \" and \\ and \n escapes). */
static size_t append_escaped(char *dst, size_t pos, size_t cap, const char *s) {
    for (; *s && pos + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            dst[pos++] = '\\';
            dst[pos++] = (char)c;
        } else if (c == '\n') {
            dst[pos++] = '\\';
            dst[pos++] = 'n';
        } else if (c < 0x20) {
            pos += (size_t)snprintf(dst + pos, cap - pos, "\\u%04x", c);
        } else {
            dst[pos++] = (char)c;
        }
    }
    return pos;
}

void kg_log_write(kg_log_level_t level, const char *module, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char tbuf[96];
    snprintf(tbuf, sizeof(tbuf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
             (int)(ts.tv_nsec / 1000000) % 1000);

    /* The message may carry trailing " key=value" pairs: split them off so
     * logfmt keeps them as fields and JSON gets them as members. */
    char *kv = NULL;
    for (char *p = msg; (p = strchr(p, ' ')) != NULL; p++) {
        char *eq = strchr(p + 1, '=');
        char *sp = strchr(p + 1, ' ');
        if (eq && (!sp || eq < sp) && eq > p + 1) {
            kv = p;
            break;
        }
    }
    char line[4096];
    size_t pos = 0, cap = sizeof(line);
    const char *lvl = level_names[level <= KG_LOG_LEVEL_OFF ? level : KG_LOG_LEVEL_ERROR];
    if (kv) {
        *kv++ = '\0';
    }
    if (log_format == KG_LOG_FORMAT_JSON) {
        pos += (size_t)snprintf(line, cap,
                                "{\"ts\":\"%s\",\"level\":\"%s\",\"module\":\"%s\",\"msg\":\"",
                                tbuf, lvl, module);
        pos = append_escaped(line, pos, cap, msg);
        if (pos < cap - 1) {
            line[pos++] = '"';
        }
        /* key=value pairs; values may be "quoted" */
        while (kv && *kv && pos + 8 < cap) {
            while (*kv == ' ') {
                kv++;
            }
            char *eq = strchr(kv, '=');
            if (!eq) {
                break;
            }
            *eq = '\0';
            char *val = eq + 1, *end;
            int quoted = *val == '"';
            if (quoted) {
                val++;
                end = strchr(val, '"');
            } else {
                end = strchr(val, ' ');
            }
            char save = end ? *end : '\0';
            if (end) {
                *end = '\0';
            }
            pos += (size_t)snprintf(line + pos, cap - pos, ",\"%s\":\"", kv);
            if (pos >= cap) {
                pos = cap - 1;
                break;
            }
            pos = append_escaped(line, pos, cap, val);
            if (pos < cap - 1) {
                line[pos++] = '"';
            }
            if (!end) {
                break;
            }
            *end = save;
            kv = end + (quoted ? 1 : 0);
        }
        if (pos < cap - 2) {
            line[pos++] = '}';
        }
    } else {
        pos += (size_t)snprintf(line, cap, "ts=%s level=%s module=%s msg=\"", tbuf, lvl, module);
        pos = append_escaped(line, pos, cap, msg);
        if (pos < cap - 1) {
            line[pos++] = '"';
        }
        if (kv) {
            pos += (size_t)snprintf(line + pos, cap - pos, " %s", kv);
        }
    }
    if (pos > cap - 2) {
        pos = cap - 2;
    }
    line[pos++] = '\n';
    line[pos] = '\0';
    fputs(line, stderr);
}
