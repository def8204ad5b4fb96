/*
 * test_json.c — the JSON number rule (src/base/qc_json.h): a non-finite number is written as
 * null by qc_json_number and by cJSON's printer (the two ways qctrain writes JSON), and
 * qc_json_valid accepts exactly RFC 8259 text (what resume keeps of metrics.jsonl).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "qc_json.h"
#include "testutil.h"

static bool valid(const char *s)
{
    return qc_json_valid(s, strlen(s));
}

int main(void)
{
    QC_TEST ("json: qc_json_number writes finite values with the format, non-finite as null") {
        char b[QC_JSON_NUM_MAX];
        T_EXPECT(strcmp(qc_json_number(b, sizeof b, "%.9g", 1.0 / 3.0), "0.333333333") == 0, "%s",
                 b);
        T_EXPECT(strcmp(qc_json_number(b, sizeof b, "%.6f", 2.5), "2.500000") == 0, "%s", b);
        T_EXPECT(strcmp(qc_json_number(b, sizeof b, "%.17g", -0.0), "-0") == 0, "%s", b);
        const double bad[4] = {(double)NAN, -(double)NAN, (double)INFINITY, -(double)INFINITY};
        for (int i = 0; i < 4; i++)
            T_EXPECT(strcmp(qc_json_number(b, sizeof b, "%.9g", bad[i]), "null") == 0,
                     "value %d: %s", i, b);
        char line[128];
        snprintf(line, sizeof line, "{\"a\":%s,\"b\":%s}", QC_JSON_NUM("%.9g", (double)NAN),
                 QC_JSON_NUM("%.3f", 1.5));
        T_EXPECT(strcmp(line, "{\"a\":null,\"b\":1.500}") == 0, "%s", line);
        T_EXPECT(valid(line), "%s is valid JSON", line);
    }
    QC_TEST ("json: cJSON (bench, inspect, config dump) prints non-finite numbers as null") {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "nan", (double)NAN);
        cJSON_AddNumberToObject(o, "inf", (double)INFINITY);
        cJSON_AddNumberToObject(o, "ninf", -(double)INFINITY);
        char *s = cJSON_PrintUnformatted(o);
        T_EXPECT(s && strcmp(s, "{\"nan\":null,\"inf\":null,\"ninf\":null}") == 0, "%s",
                 s ? s : "(null)");
        T_EXPECT(s && valid(s), "valid");
        cJSON_free(s);
        cJSON_Delete(o);
    }
    QC_TEST ("json: qc_json_valid accepts RFC 8259 values and nothing else") {
        const char *good[] = {"{}",
                              "[]",
                              "0",
                              "-0.5e+3",
                              "\"a\\u00e9\\n\"",
                              "null",
                              "true",
                              " {\"step\":3,\"x\":[1,2,{\"y\":null}]} ",
                              "{\"eval\":{\"minADE\":null}}"};
        for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
            T_EXPECT(valid(good[i]), "rejected %s", good[i]);
        const char *bad[] = {"",
                             "{\"st",
                             "{\"step\":3",
                             "{\"step\":3,}",
                             "{\"a\":nan}",
                             "{\"a\":-nan}",
                             "{\"a\":inf}",
                             "[1,]",
                             "01",
                             "1.",
                             "\"\t\"",
                             "{\"a\":1}{",
                             "{'a':1}",
                             "tru",
                             "\"\\x\"",
                             "{\"a\" 1}"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
            T_EXPECT(!valid(bad[i]), "accepted \"%s\"", bad[i]);
        /* a deep nesting is refused, not a stack overflow */
        static char deep[200001];
        memset(deep, '[', 100000);
        memset(deep + 100000, ']', 100000);
        T_EXPECT(!valid(deep), "100000 nested arrays accepted");
        T_EXPECT(valid("[[[[[[[[[[1]]]]]]]]]]"), "10 nested arrays rejected");
    }
    return qc_test_summary();
}
