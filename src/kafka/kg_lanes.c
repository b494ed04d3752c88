/* kg_lanes: parsing, weighted fair picking and pause thresholds; see kg_lanes.h. */
#include "kg_lanes.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STRIDE ((uint64_t)1 << 20)

kg_status_t kg_lanes_parse(const char *spec, kg_lanes_t *out, char *errstr, size_t errstr_size) {
    memset(out, 0, sizeof(*out));
    const char *p = spec;
    while (1) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        size_t name_len = colon ? (size_t)(colon - p) : len;
        if (out->n == KG_LANES_MAX) {
            snprintf(errstr, errstr_size, "--jobs-topic: at most %d topics", KG_LANES_MAX);
            return KG_ERR_INVALID;
        }
        if (name_len == 0 || name_len >= sizeof(out->lane[0].topic)) {
            snprintf(errstr, errstr_size, "--jobs-topic: expected topic[:weight][,...], got '%s'",
                     spec);
            return KG_ERR_INVALID;
        }
        kg_lane_t *l = &out->lane[out->n];
        memcpy(l->topic, p, name_len);
        l->topic[name_len] = '\0';
        l->weight = 1;
        if (colon) {
            char num[16];
            size_t nl = len - name_len - 1;
            char *e;
            snprintf(num, sizeof(num), "%.*s", (int)(nl < sizeof(num) ? nl : sizeof(num) - 1),
                     colon + 1);
            errno = 0;
            long w = strtol(num, &e, 10);
            if (nl == 0 || nl >= sizeof(num) || *e || errno || w < 1 || w > KG_LANE_MAX_WEIGHT) {
                snprintf(errstr, errstr_size,
                         "--jobs-topic: the weight of %s must be an integer in 1..%d", l->topic,
                         KG_LANE_MAX_WEIGHT);
                return KG_ERR_INVALID;
            }
            l->weight = (int32_t)w;
        }
        if (kg_lanes_find(out, l->topic) >= 0) {
            snprintf(errstr, errstr_size, "--jobs-topic: %s is given twice", l->topic);
            return KG_ERR_INVALID;
        }
        out->n++;
        if (!end) {
            break;
        }
        p = end + 1;
    }
    for (int i = 0; i < out->n; i++) {
        for (int k = 0; k < out->n; k++) {
            if (out->lane[k].weight > out->lane[i].weight ||
                (out->lane[k].weight == out->lane[i].weight && k < i)) {
                out->lane[i].rank++;
            }
        }
    }
    for (int i = 0; i < out->n; i++) {
        for (int k = 0; k < out->n; k++) {
            bool first = true; /* count each lower weight once */
            for (int j = 0; j < k; j++) {
                first = first && out->lane[j].weight != out->lane[k].weight;
            }
            out->lane[i].tier += first && out->lane[k].weight < out->lane[i].weight;
        }
    }
    return KG_OK;
}

int kg_lanes_find(const kg_lanes_t *l, const char *topic) {
    for (int i = 0; i < l->n; i++) {
        if (strcmp(l->lane[i].topic, topic) == 0) {
            return i;
        }
    }
    return -1;
}

int kg_lanes_pick(kg_lanes_t *l, const bool *has_work) {
    int best = -1;
    for (int i = 0; i < l->n; i++) {
        if (!has_work[i]) {
            continue;
        }
        kg_lane_t *x = &l->lane[i];
        if (x->pass < l->vtime) {
            x->pass = l->vtime; /* idle: no credit for it */
        }
        if (best < 0 || x->pass < l->lane[best].pass ||
            (x->pass == l->lane[best].pass && x->rank < l->lane[best].rank)) {
            best = i;
        }
    }
    if (best >= 0) {
        l->vtime = l->lane[best].pass;
        l->lane[best].pass += STRIDE / (uint64_t)l->lane[best].weight;
    }
    return best;
}

int32_t kg_lanes_pause_at(const kg_lanes_t *l, int i, int32_t cap) {
    if (l->n <= 1) {
        return cap;
    }
    int32_t at = cap - l->lane[i].rank * cap / (4 * (l->n - 1));
    return at > 1 ? at : 1;
}

bool kg_lanes_has_room(const kg_lanes_t *l, int i, const int32_t *n_in_engine, int32_t room) {
    int32_t n = 0;
    for (int k = 0; k < l->n; k++) {
        if (l->lane[k].tier >= l->lane[i].tier) {
            n += n_in_engine[k];
        }
    }
    return n < room;
}
