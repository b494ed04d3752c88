/* kg_mkmodel_args: the model maker's command line. `kgen mkmodel` and the
 * tests (kg_test_mkmodel) read the same flags, with the same bounds, checks
 * and messages, into a kg_mkmodel_opts_t for kg_mkmodel_write. */
#pragma once

#include "kg_mkmodel.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kg_mkmodel_args {
    KG_MKMODEL_ARGS_OK = 0,  /* the options are complete and checked: write them */
    KG_MKMODEL_ARGS_HELP,    /* --help or -h came before any error: print the usage */
    KG_MKMODEL_ARGS_VERSION, /* --version came before any error: print the version */
    KG_MKMODEL_ARGS_INVALID, /* a usage error, explained in errstr (the command exits 2) */
} kg_mkmodel_args_t;

/** Read `kgen mkmodel`'s flags (argv[0] is the command's name and skipped)
 * into *o, which starts as kg_mkmodel_opts_default(): "--flag VALUE" or
 * "--flag=VALUE", the type shorthands (--f16, --q8_0, ...), then the
 * required flags and the checks across flags (head width, family-only
 * flags, --n-vocab against the built-in vocabulary, block sizes). Flags
 * are taken left to right, so --help after a bad value is that value's
 * error. On INVALID, errstr gets the message without a program prefix
 * ("--seed S is required (see --help)"); it may quote an argument whole,
 * so give it room for the longest one. *o keeps pointers into argv.
 * @thread any */
kg_mkmodel_args_t kg_mkmodel_parse_args(
    int argc, char **argv, kg_mkmodel_opts_t *o, char *errstr, size_t errstr_size);

/** The line that reports a written model, without a program prefix:
 * "wrote PATH: ARCH n_embd=... params=N bytes=B", where params counts the
 * weights of n_vocab tokens and bytes is the file's size on disk (-1 when
 * it cannot be read). */
void kg_mkmodel_summary(const kg_mkmodel_opts_t *o, int64_t n_vocab, char *buf, size_t size);
