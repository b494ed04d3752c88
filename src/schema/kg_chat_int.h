/* kg_chat_int: the marker spellings that both recognising a template
 * (kg_chat.c) and writing its format (kg_chat_render.c) use, so the two
 * cannot drift apart. */
#pragma once

/* UTF-8 spellings of the full-width markers DeepSeek and Hunyuan use. */
#define FW_BAR       "\xef\xbd\x9c" /* "｜" */
#define LOW_LINE     "\xe2\x96\x81" /* "▁" */
#define EOS_DEEPSEEK "<" FW_BAR "end" LOW_LINE "of" LOW_LINE "sentence" FW_BAR ">"
#define USER_CN      "<\xe7\x94\xa8\xe6\x88\xb7>" /* "<用户>" */
