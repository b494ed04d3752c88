/* kg_tokenizer_wpm_data: the Unicode tables the WordPiece tokenizer reads
 * (generated into kg_tokenizer_wpm_data.c by scripts/gen-wpm-unicode). */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Classes of kg_wpm_classes: what llama.cpp's unicode flags tell apart. */
enum { KG_WPM_OTHER = 0, KG_WPM_CONTROL = 1, KG_WPM_PUNCT = 2, KG_WPM_SYMBOL = 3, KG_WPM_MARK = 4 };

typedef struct kg_wpm_range {
    uint32_t start; /* the range runs to the next entry's start */
    uint8_t cls;
} kg_wpm_range_t;

typedef struct kg_wpm_map {
    uint32_t from, to;
} kg_wpm_map_t;

extern const kg_wpm_range_t kg_wpm_classes[]; /* by start */
extern const size_t kg_wpm_n_classes;
extern const kg_wpm_map_t kg_wpm_lower[]; /* simple lowercase, by from */
extern const size_t kg_wpm_n_lower;
extern const kg_wpm_map_t kg_wpm_nfd[]; /* first code point of the NFD form, by from */
extern const size_t kg_wpm_n_nfd;
